"""Plain data shared by collectors, analytics, transport and exporters.

Everything here is a dataclass of plain values: no I/O, no behaviour beyond small helpers.
Collectors produce these, the analytics consume them, the transport serialises them. A value
that a source did not report is ``None`` (absent), never 0: see docs/design.md §2 (a
metric whose inputs are missing is absent, not zero).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, get_args

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
    # target, perfd.armed): armed from its process's first step, its steps are the profiler's, not
    # the job's (kept out of its MFU, step time, jitter and class).
    armed: bool = False
    # An ``"all"`` fold's ranks' own end times (perfd.stepfold): each rank's iteration ends when its own
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
    # prints while it starts, or the first line's arrival time (perfd.linetimes). Goodput's start-up
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


# --- LLM serving (SGLang): one record per logged batch, the server's start-up facts, a parsed
# ``/metrics`` scrape. Produced by collectors/sglang, analysed by perfd.analytics.serving.serving_analysis on
# the
# aggregator (and offline by ``perfd analyze sglang``).

BatchKind = Literal["prefill", "decode"]
LabelSet = tuple[tuple[str, str], ...]  # sorted (name, value) pairs of one Prometheus series


def label_set(labels: Mapping[str, str]) -> LabelSet:
    """The canonical, hashable form of a label map (the one every layer keys a series on)."""
    return tuple(sorted(labels.items()))


@dataclass
class ServingRecord:
    """One SGLang scheduler batch line (``Prefill batch. ...`` / ``Decode batch, ...``).

    ``time`` is epoch seconds when the line's prefix has a date (read as UTC: SGLang prints the
    server's local time without a zone). 0.2.x prefixes have only ``HH:MM:SS``: then ``time`` is None
    and ``clock_time`` holds seconds on a clock the parser unwraps across midnight (differences are
    right, the origin is not). ``fields`` keeps every raw ``key: value`` pair as printed.
    """

    kind: BatchKind
    line_no: int = 0
    time: float | None = None
    clock_time: float | None = None
    time_text: str | None = None  # the prefix's time as printed
    prefix_format: str = "none"  # "ymd" | "ymd-ms" | "hms" | "none" | "foreign"
    ranks: dict[str, int] = field(default_factory=dict)  # DP/TP/PP/EP/ATTN_CP/MOE_DP tags of the prefix
    gpu: int | None = None  # 0.2.x "[gpu=N]" / "[gpu_id=N]" message prefix
    forward_iter: int | None = None  # " [N]" after "batch" (SGLANG_LOG_FORWARD_ITERS)
    # prefill
    new_seq: int | None = None
    new_tokens: int | None = None
    cached_tokens: int | None = None
    cache_hit_rate: float | None = None  # 0.2.x-0.4.x "cache hit rate: X%" (cumulative), as a ratio
    pending_tokens: int | None = None
    input_throughput: float | None = None  # tokens/s as SGLang logged it
    mixed_running_req: int | None = None  # 0.2.x "Prefill batch(mixed #running-req: N)"
    # both
    running_req: int | None = None
    queue_req: int | None = None
    token_usage: float | None = None  # KV pool usage ratio ("token usage")
    full_token_usage: float | None = None  # hybrid models: full-attention pool
    swa_token_usage: float | None = None  # hybrid sliding-window pool
    mamba_usage: float | None = None  # hybrid mamba state pool
    cuda_graph: bool | None = None
    graph_backend: str | None = None  # "cuda graph" | "cpu graph" | "npu graph" | ...
    # decode
    kv_tokens: int | None = None  # "#token": KV slots in use
    full_kv_tokens: int | None = None  # "#full token"
    swa_kv_tokens: int | None = None  # "#swa token"
    gen_throughput: float | None = None  # tokens/s as SGLang logged it
    accept_len: float | None = None  # speculative decoding
    accept_rate: float | None = None
    est_tflops_per_gpu: float | None = None  # SGLang's own "est. prefill/decode TFLOPS/s (per GPU)"
    est_read_gbs_per_gpu: float | None = None
    fields: dict[str, str] = field(default_factory=dict)
    source: Provenance | None = None

    def timeline(self) -> float | None:
        """A time usable for differences within one log: epoch, else the unwrapped clock."""
        return self.time if self.time is not None else self.clock_time

    def kv_usage(self) -> float | None:
        """KV usage of the pool that fills first: ``token usage``, else the max of the hybrid pools."""
        if self.token_usage is not None:
            return self.token_usage
        parts = [x for x in (self.full_token_usage, self.swa_token_usage, self.mamba_usage) if x is not None]
        return max(parts) if parts else None

    def kv_tokens_in_use(self) -> int | None:
        return self.kv_tokens if self.kv_tokens is not None else self.full_kv_tokens

    def group(self) -> str:
        """The scheduler that logged this line, for combining data-parallel ranks: its DP tag."""
        dp = self.ranks.get("DP")
        return "" if dp is None else f"DP{dp}"

    def to_json(self) -> dict[str, object]:
        """Present fields only (absent ones are left out, never 0); ``time`` is written as
        ``timestamp`` (epoch seconds, the log's time read as UTC)."""
        out: dict[str, object] = {}
        for k, v in self.__dict__.items():
            if k == "time":
                if v is not None:
                    out["timestamp"] = v
            elif k == "source":
                out[k] = str(v) if v is not None else None
            elif isinstance(v, float) and not math.isfinite(v):
                out[k] = None
            elif v is not None and v != {} and k != "fields":
                out[k] = v
        out["fields"] = dict(self.fields)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ServingRecord:
        """The inverse of ``to_json``; unknown keys are refused (ValueError), not dropped."""
        kw = dict(d)
        if "timestamp" in kw:
            kw["time"] = kw.pop("timestamp")
        src = kw.pop("source", None)
        unknown = set(kw) - _field_names(cls)
        if unknown:
            raise ValueError(f"ServingRecord: unknown key(s) {', '.join(sorted(unknown))}")
        collector, _, detail = str(src).partition(":") if src else ("", "", "")
        return cls(**kw, source=Provenance(collector, detail) if src else None)


@dataclass
class ServerInfo:
    """What an SGLang server prints once at start-up (each scheduler prints its own copy)."""

    max_total_num_tokens: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    max_running_requests: int | None = None
    context_len: int | None = None
    available_gpu_mem_gb: float | None = None
    # "Load weight end. type=..., dtype=torch.bfloat16, avail mem=..., mem usage=15.07 GB." (per GPU)
    model_class: str | None = None
    torch_dtype: str | None = None
    weight_bytes_per_gpu: float | None = None
    # "KV Cache is allocated. #tokens: N, K size: X GB, V size: Y GB" (per GPU; GB = 2**30)
    kv_pool_tokens: int | None = None
    kv_pool_bytes_per_gpu: float | None = None
    # from the ``server_args=ServerArgs(...)`` line: the keys perfd uses, raw
    args: dict[str, str] = field(default_factory=dict)

    def arg_int(self, key: str) -> int | None:
        v = self.args.get(key)
        if v is None:
            return None
        try:
            return int(v)
        except ValueError:
            return None

    def arg_str(self, key: str) -> str | None:
        v = self.args.get(key)
        return None if v in (None, "None") else v

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ServerInfo:
        unknown = set(d) - _field_names(cls)
        if unknown:
            raise ValueError(f"ServerInfo: unknown key(s) {', '.join(sorted(unknown))}")
        return cls(**d)


@dataclass(frozen=True)
class HistogramSeries:
    """One Prometheus histogram series: cumulative bucket counts by upper bound (``+Inf`` last)."""

    labels: LabelSet
    buckets: tuple[tuple[float, float], ...]  # (le, cumulative count), sorted by le
    count: float | None = None
    sum: float | None = None

    def total(self) -> float | None:
        if self.count is not None:
            return self.count
        if self.buckets and math.isinf(self.buckets[-1][0]):
            return self.buckets[-1][1]
        return None


@dataclass
class MetricsSnapshot:
    """One scrape of an SGLang ``/metrics`` endpoint (``sglang:`` names), by sample name.

    ``time`` is the scraper's clock (epoch seconds). Counters are keyed by their sample name
    (``sglang:prompt_tokens_total``), histograms by their family name
    (``sglang:time_to_first_token_seconds``).
    """

    time: float
    source: str  # URL or file
    gauges: dict[str, list[tuple[LabelSet, float]]] = field(default_factory=dict)
    counters: dict[str, list[tuple[LabelSet, float]]] = field(default_factory=dict)
    histograms: dict[str, list[HistogramSeries]] = field(default_factory=dict)
    issues: list[str] = field(default_factory=list)  # what could not be used, with reasons

    def to_json(self) -> dict[str, object]:
        """Label sets as [[name, value], ...]; bucket bounds as floats (+Inf stays a float: the
        transport's JSON writes and reads Infinity)."""
        def rows(d: dict[str, list[tuple[LabelSet, float]]]) -> dict[str, list[list[object]]]:
            return {k: [[[list(p) for p in lab], v] for lab, v in vs] for k, vs in d.items()}

        return {"time": self.time, "source": self.source, "gauges": rows(self.gauges),
                "counters": rows(self.counters), "issues": list(self.issues),
                "histograms": {k: [{"labels": [list(p) for p in h.labels],
                                    "buckets": [list(b) for b in h.buckets], "count": h.count,
                                    "sum": h.sum} for h in hs]
                               for k, hs in self.histograms.items()}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MetricsSnapshot:
        def lab(x: list[list[str]]) -> LabelSet:
            return tuple((str(k), str(v)) for k, v in x)

        def rows(x: dict[str, list[Any]]) -> dict[str, list[tuple[LabelSet, float]]]:
            return {str(k): [(lab(r[0]), float(r[1])) for r in vs] for k, vs in x.items()}

        def hist(h: dict[str, Any]) -> HistogramSeries:
            return HistogramSeries(lab(h["labels"]), tuple((float(le), float(c)) for le, c in h["buckets"]),
                                   None if h.get("count") is None else float(h["count"]),
                                   None if h.get("sum") is None else float(h["sum"]))

        hists = {str(k): [hist(h) for h in hs] for k, hs in (d.get("histograms") or {}).items()}
        return cls(float(d["time"]), str(d["source"]), rows(d.get("gauges") or {}),
                   rows(d.get("counters") or {}), hists, [str(i) for i in d.get("issues") or []])


@dataclass
class ServingData:
    """The payload of the perfd.events SERVING_DATA event. What the SGLang collector sends: batch
    records new since its last send, the server's start-up
    facts (when they changed, and again now and then so a restarted aggregator has them), the latest
    ``/metrics`` scrape, and the analysis settings of its config (``window_s``, ``model``, ``gpu``,
    ``peak_tflops``, ``peak_bandwidth``). The aggregator analyses these (perfd/aggregator/serving.py)."""

    job: str
    records: list[ServingRecord] = field(default_factory=list)
    server: ServerInfo | None = None
    scrape: MetricsSnapshot | None = None
    config: dict[str, object] = field(default_factory=dict)  # checked where it is read

    def to_json(self) -> dict[str, object]:
        return {"job": self.job, "records": [r.to_json() for r in self.records],
                "server": self.server.to_json() if self.server else None,
                "scrape": self.scrape.to_json() if self.scrape else None, "config": dict(self.config)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ServingData:
        """Raises ValueError / KeyError / TypeError on a payload that is not a ServingData."""
        if not isinstance(d, dict) or not d.get("job"):
            raise ValueError("serving data without a job")
        cfg = d.get("config") or {}
        if not isinstance(cfg, dict):
            raise ValueError("serving data config is not a mapping")
        return cls(str(d["job"]), [ServingRecord.from_json(r) for r in d.get("records") or []],
                   ServerInfo.from_json(d["server"]) if d.get("server") else None,
                   MetricsSnapshot.from_json(d["scrape"]) if d.get("scrape") else None, dict(cfg))


def _field_names(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}


HOOK_FRAMEWORK = "pytorch"  # the framework of the JobInfo the step hook's job records make


def merge_job_info(held: JobInfo | None, new: JobInfo) -> JobInfo:
    """One job, two describers: a framework's log (Megatron-LM, torchtitan) says the most, the step
    hooks in the same job say the layout and dtype as the process sees them. The log's JobInfo is
    kept whichever came first, its unknown layout sizes and dtype filled from the hooks'; the same
    describer again replaces its own."""
    if held is None or held.framework == new.framework:
        return new
    if new.framework == HOOK_FRAMEWORK:
        base, hook = held, new
    elif held.framework == HOOK_FRAMEWORK:
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

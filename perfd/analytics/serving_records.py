"""Plain data for LLM serving (SGLang): one record per logged batch, the server's start-up facts, and
a parsed ``/metrics`` scrape. Produced by ``collectors/sglang``, consumed by the serving analytics.

A value the source did not print is ``None`` (absent), never 0 (DESIGN.md §2). Pure data: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from perfd.model import Provenance

BatchKind = Literal["prefill", "decode"]
LabelSet = tuple[tuple[str, str], ...]  # sorted (name, value) pairs of one Prometheus series


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

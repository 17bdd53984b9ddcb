"""LLM serving (SGLang) as plain records: one per logged batch, the server's start-up facts, a parsed
``/metrics`` scrape, and the ``serving_data`` event's payload that carries them.

Produced by collectors/sglang, analysed by perfd.analytics.serving.serving_analysis on the aggregator
(and offline by ``perfd analyze sglang``). Apart from perfd.core.model because only the serving path reads
them (collectors/sglang, the aggregator's serving window, the serving analysis and report): the training
path never does. Each carries its own JSON form, the event's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from perfd.core.model import LabelSet, Provenance
from perfd.core.record_json import JsonWritten

BatchKind = Literal["prefill", "decode"]


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
class ServerInfo(JsonWritten):
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
class ServingData(JsonWritten):
    """The payload of the perfd.core.events SERVING_DATA event. What the SGLang collector sends: batch
    records new since its last send, the server's start-up
    facts (when they changed, and again now and then so a restarted aggregator has them), the latest
    ``/metrics`` scrape, and the analysis settings of its config (``window_s``, ``model``, ``gpu``,
    ``peak_tflops``, ``peak_bandwidth``). The aggregator analyses these (perfd/aggregator/serving.py)."""

    job: str
    records: list[ServingRecord] = field(default_factory=list)
    server: ServerInfo | None = None
    scrape: MetricsSnapshot | None = None
    config: dict[str, object] = field(default_factory=dict)  # checked where it is read

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

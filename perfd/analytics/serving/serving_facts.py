"""What the serving findings and recommendations say, as typed facts: each condition of the
serving playbook (perfd.analytics.serving.serving_findings) gives its finding and its recommendation a
kind and their numbers; the words are made where they are shown (perfd.report.serving_text). Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from perfd.analytics.common import TextEnum
from perfd.analytics.finding_types import Recommendation
from perfd.core.record_json import unwritten


@dataclass(frozen=True, slots=True, kw_only=True)
class ItlTailFacts:
    """The inter-token latency's P99 far over its P50 (s); the chunked prefill size (None: unknown)."""

    p50: float
    p99: float
    chunk: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TtftFacts:
    """A high P99 time to first token (s), its P50, the mean queue, the chunked prefill size."""

    p99: float
    p50: float | None
    queued: float | None
    chunk: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefixHitFacts:
    """A low prefix-cache hit while prefill batches reuse prefixes; the schedule policy."""

    hit: float
    reuse: float
    policy: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class KvFullFacts:
    """The KV pool's mean use over its threshold."""

    kv: float


@dataclass(frozen=True, slots=True, kw_only=True)
class KvIdleFacts:
    """The KV pool little used while requests queue; the running batch, its cap, and whether it is at
    the cap (then the cap is the limit)."""

    kv: float
    queued: float
    mrr: int | None
    running: float | None
    at_cap: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueFacts:
    """The queue grows (per s) while the batch is small; ``memory``: the KV cache is the limit."""

    growth: float
    fill: float
    kv: float | None
    mrr: int | None
    memory: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class CudaGraphFacts:
    """The share of decode batches that used CUDA graphs, low; the mean running batch."""

    share: float
    running: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class EfficiencyFacts:
    """Decode MBU, decode and prefill MFU, and the decode steps per second."""

    mbu: float | None
    decode_mfu: float | None
    prefill_mfu: float | None
    steps_per_s: float | None


class ServingAbsent(TextEnum):
    """A figure the window has none of (the finding quotes why: ServingFinding.quotes)."""

    EFFICIENCY = "efficiency"  # neither decode MBU nor MFU
    LATENCY = "latency"  # no latency percentiles


ServingFacts = (ItlTailFacts | TtftFacts | PrefixHitFacts | KvFullFacts | KvIdleFacts | QueueFacts
                | CudaGraphFacts | EfficiencyFacts | ServingAbsent)
ServingRecFacts = (ItlTailFacts | TtftFacts | PrefixHitFacts | KvFullFacts | KvIdleFacts | QueueFacts
                   | CudaGraphFacts)


class ServingStatus(TextEnum):
    """The serving report's status: the worst finding's severity."""

    CRITICAL = "critical"
    WARNING = "warning"
    HEALTHY = "healthy"


@dataclass
class ServingRecommendation(Recommendation):
    """A serving recommendation with its action and detail left to the report."""

    facts: ServingRecFacts | None = field(default=None, metadata=unwritten())

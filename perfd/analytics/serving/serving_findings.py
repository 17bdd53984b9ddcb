"""Serving findings and recommendations: docs/design.md §2's serving playbook over a ServingFigures.

The thresholds are declared in ``perfd/analytics/thresholds.py``; ``rules/serving.yaml`` is checked
against them (tests/test_thresholds.py) and a test evaluates both on the same values, so the live
rules and the offline report cannot disagree. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from perfd.analytics import thresholds as th
from perfd.analytics.finding_types import SEVERITY_ORDER, Finding, Recommendation, Severity
from perfd.analytics.serving.serving_facts import (
    CudaGraphFacts,
    EfficiencyFacts,
    ItlTailFacts,
    KvFullFacts,
    KvIdleFacts,
    PrefixHitFacts,
    QueueFacts,
    ServingAbsent,
    ServingFacts,
    ServingRecFacts,
    ServingRecommendation,
    ServingStatus,
    TtftFacts,
)
from perfd.analytics.serving.spec import MetricValue
from perfd.analytics.steps.provenance import Cited
from perfd.core.record_json import unwritten
from perfd.core.serving_records import ServerInfo

# Thresholds: perfd/analytics/thresholds.py (declared once; rules/serving.yaml is checked against it).
ITL_TAIL_RATIO = th.ITL_TAIL_RATIO.value
TTFT_P99_HIGH_S = th.TTFT_P99_HIGH_S.value
PREFIX_HIT_LOW = th.PREFIX_HIT_LOW.value
PREFIX_REUSE_BATCHES = th.PREFIX_REUSE_BATCHES.value
KV_NEAR_FULL = th.KV_NEAR_FULL.value
KV_LOW = th.KV_LOW.value
QUEUE_GROWTH_PER_S = th.QUEUE_GROWTH_PER_S.value
BATCH_SMALL = th.BATCH_SMALL.value
CUDA_GRAPH_LOW = th.CUDA_GRAPH_LOW.value


class ServingFigures(Protocol):
    """What the findings read of a serving summary (perfd.analytics.serving.serving_analysis
    .ServingSummary): its values by key and the extras they were read from."""

    @property
    def values(self) -> Mapping[str, MetricValue]: ...

    @property
    def extras(self) -> Mapping[str, object]: ...

    def value(self, key: str) -> float | None: ...


@dataclass
class ServingFinding(Finding):
    """A serving finding whose window, source and quoted sentences are kept as codes (the summary's:
    a value's source or why it is absent), worded where it is shown (perfd.report.serving_report
    .shown_finding): ``span`` becomes ``iterations``, ``cited`` its ``source``, ``facts`` its title and
    observation, and ``quotes`` fill the ``{}`` of that observation in order (None: nothing to quote)."""

    span: Cited | None = field(default=None, metadata=unwritten())
    cited: Cited | None = field(default=None, metadata=unwritten())
    quotes: tuple[Cited | None, ...] = field(default=(), metadata=unwritten())
    # the finding's kind and numbers: its title and observation are the report's (perfd.report.serving_text)
    facts: ServingFacts | None = field(default=None, metadata=unwritten())


@dataclass(frozen=True)
class _Window:
    """What every finding reads: the summary's values and their sources, the window, the server's
    scheduling settings."""

    s: ServingFigures
    src: Mapping[str, Cited | None]  # value key -> its source, or why it is absent
    span: Cited | None
    chunk: int | None  # --chunked-prefill-size
    policy: str | None  # --schedule-policy
    mrr: int | None  # max_running_requests

    def val(self, key: str) -> float | None:
        return self.s.value(key) if key in self.s.values else None


def _window(s: ServingFigures, server: ServerInfo | None) -> _Window:
    src = {k: mv.source or mv.reason for k, mv in s.values.items()}
    chunk = server.chunked_prefill_size if server else None
    if chunk is None and server is not None:
        chunk = server.arg_int("chunked_prefill_size")
    span = s.extras.get("window")  # the records' span (serving_analysis._window_span)
    return _Window(s, src, span if isinstance(span, Cited) else None, chunk,
                   server.arg_str("schedule_policy") if server else None,
                   server.max_running_requests if server else None)


_Found = list[Finding]
_Recs = list[Recommendation]


def _rec(facts: ServingRecFacts, impact: float) -> ServingRecommendation:
    """A recommendation tied to the finding its facts came with (its words are the report's)."""
    return ServingRecommendation("", _ID[type(facts)], 0, "", "", impact, facts=facts)


# --- latency --------------------------------------------------------------------------------------
def _itl_tail(w: _Window, f: _Found, r: _Recs) -> None:
    p50, p99 = w.val("itl_p50"), w.val("itl_p99")
    if not (p50 and p99 is not None and p99 > ITL_TAIL_RATIO * p50):
        return
    said = ItlTailFacts(p50=p50, p99=p99, chunk=w.chunk)
    f.append(ServingFinding(
        "itl-tail", Severity.WARNING, "", "",
        {"itl_p50_s": p50, "itl_p99_s": p99, "ratio": p99 / p50, "chunked_prefill_size": w.chunk},
        span=w.span, cited=w.src.get("itl_p99"), facts=said))
    r.append(_rec(said, p99 / p50 / 10))


def _ttft_high(w: _Window, f: _Found, r: _Recs) -> None:
    ttft = w.val("ttft_p99")
    if not (ttft is not None and ttft > TTFT_P99_HIGH_S):
        return
    said = TtftFacts(p99=ttft, p50=w.val("ttft_p50"), queued=w.val("queued_requests"), chunk=w.chunk)
    f.append(ServingFinding(
        "ttft-high", Severity.WARNING, "", "",
        {"ttft_p50_s": said.p50, "ttft_p99_s": ttft, "queued": said.queued, "chunked_prefill_size": w.chunk},
        span=w.span, cited=w.src.get("ttft_p99"), facts=said))
    r.append(_rec(said, ttft / 10))


# --- prefix cache ---------------------------------------------------------------------------------
def _prefix_hit_low(w: _Window, f: _Found, r: _Recs) -> None:
    hit, reuse = w.val("prefix_hit"), w.val("prefix_hit_batches")
    if not (hit is not None and hit < PREFIX_HIT_LOW and reuse is not None and reuse >= PREFIX_REUSE_BATCHES):
        return
    said = PrefixHitFacts(hit=hit, reuse=reuse, policy=w.policy)
    f.append(ServingFinding(
        "prefix-hit-low", Severity.WARNING, "", "",
        {"prefix_hit": hit, "prefill_batches_with_hit": reuse, "schedule_policy": w.policy},
        span=w.span, cited=w.src.get("prefix_hit"), facts=said))
    r.append(_rec(said, PREFIX_HIT_LOW - hit))


# --- KV cache and queueing ------------------------------------------------------------------------
def _kv_near_full(w: _Window, f: _Found, r: _Recs) -> None:
    kv = w.val("kv_usage")
    if not (kv is not None and kv > KV_NEAR_FULL):
        return
    said = KvFullFacts(kv=kv)
    f.append(ServingFinding(
        "kv-near-full", Severity.WARNING, "", "", {"kv_usage": kv, "queued": w.val("queued_requests")},
        span=w.span, cited=w.src.get("kv_usage"), facts=said))
    r.append(_rec(said, kv - 0.5))


def _kv_low_while_queued(w: _Window, f: _Found, r: _Recs) -> None:
    kv, queued = w.val("kv_usage"), w.val("queued_requests")
    if not (kv is not None and kv < KV_LOW and queued is not None and queued > 0):
        return
    mrr, run = w.mrr, w.val("running_requests")
    said = KvIdleFacts(kv=kv, queued=queued, mrr=mrr, running=run,
                       at_cap=bool(mrr and run is not None and run >= 0.9 * mrr))
    f.append(ServingFinding(
        "kv-low-while-queued", Severity.WARNING, "", "", {"kv_usage": kv, "queued": queued,
                                                         "max_running_requests": mrr},
        span=w.span, cited=w.src.get("kv_usage"), facts=said))
    r.append(_rec(said, KV_LOW - kv))


def _queue_growing(w: _Window, f: _Found, r: _Recs) -> None:
    kv, growth, fill = w.val("kv_usage"), w.val("queue_growth"), w.val("batch_fill")
    if not (growth is not None and growth > QUEUE_GROWTH_PER_S and fill is not None and fill < BATCH_SMALL):
        return
    said = QueueFacts(growth=growth, fill=fill, kv=kv, mrr=w.mrr, memory=kv is not None and kv >= 0.8)
    f.append(ServingFinding(
        "queue-growing", Severity.WARNING, "", "",
        {"queue_growth_per_s": growth, "batch_fill": fill, "kv_usage": kv}, span=w.span,
        cited=w.src.get("queue_growth"), facts=said))
    r.append(_rec(said, 1.0))


# --- CUDA graphs ----------------------------------------------------------------------------------
def _cuda_graph_low(w: _Window, f: _Found, r: _Recs) -> None:
    cg = w.val("cuda_graph")
    if not (cg is not None and cg < CUDA_GRAPH_LOW):
        return
    run = w.val("running_requests")
    said = CudaGraphFacts(share=cg, running=run)
    f.append(ServingFinding(
        "cuda-graph-low", Severity.INFO, "", "", {"cuda_graph_share": cg, "running_requests": run},
        span=w.span, cited=w.src.get("cuda_graph"), facts=said))
    r.append(_rec(said, (1 - cg) / 4))


# --- efficiency (evidence, not a judgement) -------------------------------------------------------
def _efficiency(w: _Window, f: _Found, r: _Recs) -> None:
    mbu, dmfu, pmfu = w.val("decode_mbu"), w.val("decode_mfu"), w.val("prefill_mfu")
    steps = w.s.extras.get("decode_steps_per_s")
    if mbu is not None or dmfu is not None or pmfu is not None:
        f.append(ServingFinding(
            "efficiency", Severity.INFO, "", "",
            {"decode_mbu": mbu, "decode_mfu": dmfu, "prefill_mfu": pmfu, "decode_steps_per_s": steps,
             "decode_bytes_per_step_per_gpu": w.s.extras.get("decode_bytes_per_step_per_gpu")},
            span=w.span, cited=w.src.get("decode_mbu" if mbu is not None else "decode_mfu"),
            facts=EfficiencyFacts(mbu=mbu, decode_mfu=dmfu, prefill_mfu=pmfu,
                                  steps_per_s=float(steps) if isinstance(steps, (int, float)) else None)))
    else:
        f.append(ServingFinding("efficiency-absent", Severity.INFO, "", "", {}, span=w.span,
                                quotes=(w.src.get("decode_mbu"), w.src.get("decode_mfu")),
                                facts=ServingAbsent.EFFICIENCY))


def _latency_absent(w: _Window, f: _Found, r: _Recs) -> None:
    if w.val("ttft_p99") is None and w.val("itl_p99") is None:
        f.append(ServingFinding("latency-absent", Severity.INFO, "", "", {}, span=w.span,
                                quotes=(w.src.get("ttft_p99"),), facts=ServingAbsent.LATENCY))


# The finding each recommendation's facts are of.
_ID: dict[type, str] = {ItlTailFacts: "itl-tail", TtftFacts: "ttft-high", PrefixHitFacts: "prefix-hit-low",
                        KvFullFacts: "kv-near-full", KvIdleFacts: "kv-low-while-queued",
                        QueueFacts: "queue-growing", CudaGraphFacts: "cuda-graph-low"}


# Each finding of the serving playbook, in the order they are derived (the sort below is stable).
_FINDINGS: tuple[Callable[[_Window, _Found, _Recs], None], ...] = (
    _itl_tail, _ttft_high, _prefix_hit_low, _kv_near_full, _kv_low_while_queued, _queue_growing,
    _cuda_graph_low, _efficiency, _latency_absent)


def derive_serving_findings(s: ServingFigures, server: ServerInfo | None
                            ) -> tuple[list[Finding], list[Recommendation]]:
    """Findings (with evidence) and recommendations (each tied to a finding), ordered."""
    f: _Found = []
    r: _Recs = []
    w = _window(s, server)
    for finding in _FINDINGS:
        finding(w, f, r)
    f.sort(key=lambda x: SEVERITY_ORDER.get(x.severity, 3))
    sev = {x.id: SEVERITY_ORDER.get(x.severity, 3) for x in f}
    r.sort(key=lambda x: (sev.get(x.finding_id, 3), -(x.impact if x.impact is not None else -1.0)))
    for i, rec in enumerate(r, start=1):
        rec.priority, rec.id = i, f"R{i}"
    return f, r


def serving_status(findings: list[Finding]) -> ServingStatus:
    """The report summary's status: the worst finding's severity (its words: perfd.report.serving_text)."""
    worst = min((SEVERITY_ORDER.get(x.severity, 3) for x in findings), default=3)
    if worst == 0:
        return ServingStatus.CRITICAL
    if worst == 1:
        return ServingStatus.WARNING
    return ServingStatus.HEALTHY

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
from perfd.analytics.serving.spec import MetricValue
from perfd.analytics.steps.provenance import Cited
from perfd.serving_records import ServerInfo

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


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.1f} ms"


@dataclass
class ServingFinding(Finding):
    """A serving finding whose window, source and quoted sentences are kept as codes (the summary's:
    a value's source or why it is absent), worded where it is shown (perfd.report.serving_report
    .shown_finding): ``span`` becomes ``iterations``, ``cited`` its ``source``, and ``quotes`` fill the
    ``{}`` of its ``observation`` in order (None: nothing to quote)."""

    span: Cited | None = field(default=None, metadata={"json": False})
    cited: Cited | None = field(default=None, metadata={"json": False})
    quotes: tuple[Cited | None, ...] = field(default=(), metadata={"json": False})


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


# --- latency --------------------------------------------------------------------------------------
def _itl_tail(w: _Window, f: _Found, r: _Recs) -> None:
    p50, p99 = w.val("itl_p50"), w.val("itl_p99")
    if not (p50 and p99 is not None and p99 > ITL_TAIL_RATIO * p50):
        return
    chunk = w.chunk
    f.append(ServingFinding(
        "itl-tail", Severity.WARNING, f"Inter-token latency P99 {p99 / p50:.1f}× the P50",
        f"P99 inter-token latency {_ms(p99)} against a P50 of {_ms(p50)} (> {ITL_TAIL_RATIO:g}×): "
        "decode steps wait behind prefill chunks scheduled between them.",
        {"itl_p50_s": p50, "itl_p99_s": p99, "ratio": p99 / p50, "chunked_prefill_size": chunk},
        span=w.span, cited=w.src.get("itl_p99")))
    act = (f"Lower --chunked-prefill-size (now {chunk}, try {max(chunk // 2, 512)})" if chunk
           else "Use a smaller --chunked-prefill-size")
    r.append(Recommendation(
        "", "itl-tail", 0, act + " so prefill interrupts decode in shorter slices",
        "or separate prefill from decode (--enable-mixed-chunk, PD disaggregation); weigh against "
        "TTFT (finding ttft-high)", p99 / p50 / 10))


def _ttft_high(w: _Window, f: _Found, r: _Recs) -> None:
    ttft = w.val("ttft_p99")
    if not (ttft is not None and ttft > TTFT_P99_HIGH_S):
        return
    chunk = w.chunk
    queued_now = w.val("queued_requests")
    f.append(ServingFinding(
        "ttft-high", Severity.WARNING, f"P99 time to first token {ttft:.2f} s",
        f"P99 TTFT {ttft:.2f} s (> {TTFT_P99_HIGH_S:g} s; P50 {_ms(w.val('ttft_p50'))}): long prompts "
        "take many prefill chunks, or requests wait in the queue (mean queued "
        f"{'n/a' if queued_now is None else f'{queued_now:.1f}'}).",
        {"ttft_p50_s": w.val("ttft_p50"), "ttft_p99_s": ttft, "queued": queued_now,
         "chunked_prefill_size": chunk}, span=w.span, cited=w.src.get("ttft_p99")))
    act = (f"Raise --chunked-prefill-size (now {chunk}, try {chunk * 2}) for long prompts" if chunk
           else "Use a larger --chunked-prefill-size for long prompts")
    r.append(Recommendation(
        "", "ttft-high", 0, act, "if requests queue instead, add capacity (finding queue-growing); "
        "this trades against inter-token latency", ttft / 10))


# --- prefix cache ---------------------------------------------------------------------------------
def _prefix_hit_low(w: _Window, f: _Found, r: _Recs) -> None:
    hit, reuse = w.val("prefix_hit"), w.val("prefix_hit_batches")
    if not (hit is not None and hit < PREFIX_HIT_LOW and reuse is not None and reuse >= PREFIX_REUSE_BATCHES):
        return
    policy = w.policy
    f.append(ServingFinding(
        "prefix-hit-low", Severity.WARNING,
        f"Prefix-cache hit {_pct(hit)} although prompts share prefixes",
        f"Only {_pct(hit)} of prompt tokens came from the radix cache, yet {_pct(reuse)} of prefill "
        "batches reused some cached prefix: prompts share prefixes that the cache does not keep or "
        "the schedule does not exploit.",
        {"prefix_hit": hit, "prefill_batches_with_hit": reuse, "schedule_policy": policy},
        span=w.span, cited=w.src.get("prefix_hit")))
    act = ("Schedule by longest prefix match (--schedule-policy lpm)" if policy != "lpm"
           else "Keep more prefixes cached: more KV room (--mem-fraction-static); with several DP "
                "ranks route requests cache-aware")
    r.append(Recommendation("", "prefix-hit-low", 0, act, f"schedule policy now: {policy or 'unknown'}",
                            PREFIX_HIT_LOW - hit))


# --- KV cache and queueing ------------------------------------------------------------------------
def _kv_near_full(w: _Window, f: _Found, r: _Recs) -> None:
    kv = w.val("kv_usage")
    if not (kv is not None and kv > KV_NEAR_FULL):
        return
    f.append(ServingFinding(
        "kv-near-full", Severity.WARNING, f"KV cache {_pct(kv)} full",
        f"The KV pool averages {_pct(kv)} used (> {KV_NEAR_FULL:.0%}): new requests wait for memory "
        "and running ones may be retracted.",
        {"kv_usage": kv, "queued": w.val("queued_requests")}, span=w.span, cited=w.src.get("kv_usage")))
    r.append(Recommendation(
        "", "kv-near-full", 0, "Give the KV cache more room: raise --mem-fraction-static, quantize it "
        "(--kv-cache-dtype fp8_e4m3), or serve a GQA model",
        "fewer --max-running-requests trades throughput for fewer retractions", kv - 0.5))


def _kv_low_while_queued(w: _Window, f: _Found, r: _Recs) -> None:
    kv, queued = w.val("kv_usage"), w.val("queued_requests")
    if not (kv is not None and kv < KV_LOW and queued is not None and queued > 0):
        return
    mrr = w.mrr
    f.append(ServingFinding(
        "kv-low-while-queued", Severity.WARNING, f"KV cache only {_pct(kv)} used while requests wait",
        f"{queued:.1f} requests queued on average while the KV pool is {_pct(kv)} used: the limit is "
        "not memory.", {"kv_usage": kv, "queued": queued, "max_running_requests": mrr},
        span=w.span, cited=w.src.get("kv_usage")))
    run = w.val("running_requests")
    if mrr and run is not None and run >= 0.9 * mrr:
        act = f"Raise --max-running-requests (now {mrr})"
        why = f"the running batch ({run:.0f}) is at the cap"
    else:
        act = ("Admit more prefill per step: a larger --chunked-prefill-size / --max-prefill-tokens, "
               "or a lower --schedule-conservativeness")
        why = (f"the running batch ({run:.0f}) is far below max_running_requests={mrr}"
               if mrr and run is not None else "max_running_requests unknown")
    r.append(Recommendation("", "kv-low-while-queued", 0, act, why, KV_LOW - kv))


def _queue_growing(w: _Window, f: _Found, r: _Recs) -> None:
    kv, growth, fill = w.val("kv_usage"), w.val("queue_growth"), w.val("batch_fill")
    if not (growth is not None and growth > QUEUE_GROWTH_PER_S and fill is not None and fill < BATCH_SMALL):
        return
    mem = kv is not None and kv >= 0.8
    cause = (f" and the KV cache is {_pct(kv)} used: the KV cache is too small for more concurrent "
             "requests" if mem else ".")
    f.append(ServingFinding(
        "queue-growing", Severity.WARNING, f"Queue grows {growth * 60:.1f}/min while the batch is small",
        f"Queued requests grow by {growth:.2f}/s while the running batch is {_pct(fill)} of "
        f"max_running_requests={w.mrr}" + cause,
        {"queue_growth_per_s": growth, "batch_fill": fill, "kv_usage": kv}, span=w.span,
        cited=w.src.get("queue_growth")))
    act = ("KV cache too small: more GPU memory for it (--mem-fraction-static, more GPUs), a GQA "
           "model or KV quantization (--kv-cache-dtype fp8_e4m3)" if mem else
           "Admit requests faster: a larger --chunked-prefill-size / --max-prefill-tokens, or a lower "
           "--schedule-conservativeness")
    r.append(Recommendation("", "queue-growing", 0, act, "or add replicas: the queue will not drain", 1.0))


# --- CUDA graphs ----------------------------------------------------------------------------------
def _cuda_graph_low(w: _Window, f: _Found, r: _Recs) -> None:
    cg = w.val("cuda_graph")
    if not (cg is not None and cg < CUDA_GRAPH_LOW):
        return
    run = w.val("running_requests")
    f.append(ServingFinding(
        "cuda-graph-low", Severity.INFO, f"{_pct(1 - cg)} of decode batches ran without CUDA graphs",
        f"Only {_pct(cg)} of logged decode batches used CUDA graphs: batches above "
        "--cuda-graph-max-bs (or with unsupported features) run eagerly, paying launch overhead.",
        {"cuda_graph_share": cg, "running_requests": run}, span=w.span, cited=w.src.get("cuda_graph")))
    r.append(Recommendation(
        "", "cuda-graph-low", 0, "Raise --cuda-graph-max-bs to cover the running batch",
        "mean running batch n/a" if run is None else f"mean running batch {run:.1f}", (1 - cg) / 4))


# --- efficiency (evidence, not a judgement) -------------------------------------------------------
def _efficiency(w: _Window, f: _Found, r: _Recs) -> None:
    mbu, dmfu, pmfu = w.val("decode_mbu"), w.val("decode_mfu"), w.val("prefill_mfu")
    steps = w.s.extras.get("decode_steps_per_s")
    if mbu is not None or dmfu is not None or pmfu is not None:
        f.append(ServingFinding(
            "efficiency", Severity.INFO,
            f"Decode MBU {_pct(mbu)}, decode MFU {_pct(dmfu)}, prefill MFU {_pct(pmfu)}",
            f"Decode reads weights + KV at {_pct(mbu)} of peak memory bandwidth"
            + (f" (~{steps:.1f} steps/s)" if steps else "")
            + f"; model FLOPs at {_pct(dmfu)} (decode) + {_pct(pmfu)} (prefill) of peak. Decode is "
            "bandwidth-bound: MBU, not MFU, is its ceiling; a small running batch keeps both low.",
            {"decode_mbu": mbu, "decode_mfu": dmfu, "prefill_mfu": pmfu, "decode_steps_per_s": steps,
             "decode_bytes_per_step_per_gpu": w.s.extras.get("decode_bytes_per_step_per_gpu")},
            span=w.span, cited=w.src.get("decode_mbu" if mbu is not None else "decode_mfu")))
    else:
        f.append(ServingFinding("efficiency-absent", Severity.INFO, "MBU / MFU not available",
                                "decode MBU: {}; decode MFU: {}", {}, span=w.span,
                                quotes=(w.src.get("decode_mbu"), w.src.get("decode_mfu"))))


def _latency_absent(w: _Window, f: _Found, r: _Recs) -> None:
    if w.val("ttft_p99") is None and w.val("itl_p99") is None:
        f.append(ServingFinding(
            "latency-absent", Severity.INFO, "No latency percentiles",
            "TTFT/ITL/e2e percentiles come only from SGLang's /metrics histograms: {}. "
            "Start SGLang with --enable-metrics and pass its /metrics URL.", {}, span=w.span,
            quotes=(w.src.get("ttft_p99"),)))


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


def serving_status(findings: list[Finding]) -> tuple[str, str]:
    """(status, text) of the report summary: the worst finding's severity."""
    worst = min((SEVERITY_ORDER.get(x.severity, 3) for x in findings), default=3)
    if worst == 0:
        return "critical", "a serving SLO or capacity problem needs action"
    if worst == 1:
        return "warning", "the serving playbook has suggestions"
    return "healthy", "no serving problem found in the window"

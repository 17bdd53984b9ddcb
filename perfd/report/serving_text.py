"""The serving findings and recommendations as they read: each finding's title and
observation and each recommendation's action and detail, from their kind and numbers
(perfd.analytics.serving.serving_facts), and the report's status sentence. Pure."""

from __future__ import annotations

import dataclasses

from perfd.analytics import thresholds as th
from perfd.analytics.finding_types import Recommendation
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

# The summary's status sentence.
STATUS_TEXT: dict[ServingStatus, str] = {
    ServingStatus.CRITICAL: "a serving SLO or capacity problem needs action",
    ServingStatus.WARNING: "the serving playbook has suggestions",
    ServingStatus.HEALTHY: "no serving problem found in the window",
}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.1f} ms"


def finding_words(f: ServingFacts) -> tuple[str, str]:
    """A serving finding's title and observation (an absent figure's observation has a ``{}`` for each
    of the finding's quotes)."""
    match f:
        case ItlTailFacts():
            return (f"Inter-token latency P99 {f.p99 / f.p50:.1f}× the P50",
                    f"P99 inter-token latency {_ms(f.p99)} against a P50 of {_ms(f.p50)} "
                    f"(> {th.ITL_TAIL_RATIO.value:g}×): decode steps wait behind prefill chunks scheduled "
                    "between them.")
        case TtftFacts():
            return (f"P99 time to first token {f.p99:.2f} s",
                    f"P99 TTFT {f.p99:.2f} s (> {th.TTFT_P99_HIGH_S.value:g} s; P50 {_ms(f.p50)}): long "
                    "prompts take many prefill chunks, or requests wait in the queue (mean queued "
                    f"{'n/a' if f.queued is None else f'{f.queued:.1f}'}).")
        case PrefixHitFacts():
            return (f"Prefix-cache hit {_pct(f.hit)} although prompts share prefixes",
                    f"Only {_pct(f.hit)} of prompt tokens came from the radix cache, yet {_pct(f.reuse)} of "
                    "prefill batches reused some cached prefix: prompts share prefixes that the cache does "
                    "not keep or the schedule does not exploit.")
        case KvFullFacts():
            return (f"KV cache {_pct(f.kv)} full",
                    f"The KV pool averages {_pct(f.kv)} used (> {th.KV_NEAR_FULL.value:.0%}): new requests "
                    "wait for memory and running ones may be retracted.")
        case KvIdleFacts():
            return (f"KV cache only {_pct(f.kv)} used while requests wait",
                    f"{f.queued:.1f} requests queued on average while the KV pool is {_pct(f.kv)} used: the "
                    "limit is not memory.")
        case QueueFacts():
            cause = (f" and the KV cache is {_pct(f.kv)} used: the KV cache is too small for more "
                     "concurrent requests" if f.memory else ".")
            return (f"Queue grows {f.growth * 60:.1f}/min while the batch is small",
                    f"Queued requests grow by {f.growth:.2f}/s while the running batch is {_pct(f.fill)} "
                    f"of max_running_requests={f.mrr}" + cause)
        case CudaGraphFacts():
            return (f"{_pct(1 - f.share)} of decode batches ran without CUDA graphs",
                    f"Only {_pct(f.share)} of logged decode batches used CUDA graphs: batches above "
                    "--cuda-graph-max-bs (or with unsupported features) run eagerly, paying launch "
                    "overhead.")
        case EfficiencyFacts():
            steps = f.steps_per_s
            return (f"Decode MBU {_pct(f.mbu)}, decode MFU {_pct(f.decode_mfu)}, prefill MFU "
                    f"{_pct(f.prefill_mfu)}",
                    f"Decode reads weights + KV at {_pct(f.mbu)} of peak memory bandwidth"
                    + (f" (~{steps:.1f} steps/s)" if steps else "")
                    + f"; model FLOPs at {_pct(f.decode_mfu)} (decode) + {_pct(f.prefill_mfu)} (prefill) of "
                    "peak. Decode is bandwidth-bound: MBU, not MFU, is its ceiling; a small running batch "
                    "keeps both low.")
        case ServingAbsent.EFFICIENCY:
            return "MBU / MFU not available", "decode MBU: {}; decode MFU: {}"
        case ServingAbsent.LATENCY:
            return ("No latency percentiles",
                    "TTFT/ITL/e2e percentiles come only from SGLang's /metrics histograms: {}. "
                    "Start SGLang with --enable-metrics and pass its /metrics URL.")


def recommendation_words(f: ServingRecFacts) -> tuple[str, str]:
    """A serving recommendation's action and detail."""
    match f:
        case ItlTailFacts():
            chunk = f.chunk
            act = (f"Lower --chunked-prefill-size (now {chunk}, try {max(chunk // 2, 512)})" if chunk
                   else "Use a smaller --chunked-prefill-size")
            return (act + " so prefill interrupts decode in shorter slices",
                    "or separate prefill from decode (--enable-mixed-chunk, PD disaggregation); weigh "
                    "against TTFT (finding ttft-high)")
        case TtftFacts():
            chunk = f.chunk
            return (f"Raise --chunked-prefill-size (now {chunk}, try {chunk * 2}) for long prompts" if chunk
                    else "Use a larger --chunked-prefill-size for long prompts",
                    "if requests queue instead, add capacity (finding queue-growing); this trades against "
                    "inter-token latency")
        case PrefixHitFacts():
            return ("Schedule by longest prefix match (--schedule-policy lpm)" if f.policy != "lpm"
                    else "Keep more prefixes cached: more KV room (--mem-fraction-static); with several DP "
                         "ranks route requests cache-aware",
                    f"schedule policy now: {f.policy or 'unknown'}")
        case KvFullFacts():
            return ("Give the KV cache more room: raise --mem-fraction-static, quantize it (--kv-cache-dtype "
                    "fp8_e4m3), or serve a GQA model",
                    "fewer --max-running-requests trades throughput for fewer retractions")
        case KvIdleFacts():
            mrr, run = f.mrr, f.running
            if f.at_cap:
                return (f"Raise --max-running-requests (now {mrr})",
                        f"the running batch ({run:.0f}) is at the cap")
            return ("Admit more prefill per step: a larger --chunked-prefill-size / --max-prefill-tokens, or "
                    "a lower --schedule-conservativeness",
                    f"the running batch ({run:.0f}) is far below max_running_requests={mrr}"
                    if mrr and run is not None else "max_running_requests unknown")
        case QueueFacts():
            return ("KV cache too small: more GPU memory for it (--mem-fraction-static, more GPUs), a GQA "
                    "model or KV quantization (--kv-cache-dtype fp8_e4m3)" if f.memory else
                    "Admit requests faster: a larger --chunked-prefill-size / --max-prefill-tokens, or a "
                    "lower --schedule-conservativeness", "or add replicas: the queue will not drain")
        case CudaGraphFacts():
            return ("Raise --cuda-graph-max-bs to cover the running batch",
                    "mean running batch n/a" if f.running is None else f"mean running batch {f.running:.1f}")


def worded_serving_recommendation(r: Recommendation) -> Recommendation:
    """A serving recommendation (ServingRecommendation) with its action and detail; any other as it is."""
    if not isinstance(r, ServingRecommendation) or r.facts is None:
        return r
    action, detail = recommendation_words(r.facts)
    return dataclasses.replace(r, action=action, detail=detail, facts=None)

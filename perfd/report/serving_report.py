"""The four-part report of a serving job (Summary, Metrics with sources, Findings with evidence,
Recommendations tied to findings), in the same types as the training report so ``render_text``,
``render_rich`` and ``Report.to_json`` work on it unchanged, and the summary's JSON: where the
analysis' codes (a value's source or why it is absent, the window, a finding's quotes) become their
sentences (perfd.report.provenance_text). Pure."""

from __future__ import annotations

import dataclasses
import math

from perfd.analytics.finding_types import Finding
from perfd.analytics.serving.serving_analysis import CATALOG_NAMES, ServingAnalysis
from perfd.analytics.serving.serving_findings import ServingFinding, serving_status
from perfd.analytics.steps.provenance import Cited
from perfd.core import catalog
from perfd.report.provenance_text import text
from perfd.report.serving_text import STATUS_TEXT, finding_words, worded_serving_recommendation
from perfd.report.training_report import Report, ReportMetric, ReportSummary, format_value

# the first warning finding decides what the summary names as the limit
_LIMITS: dict[str, str] = {
    "queue-growing": "kv-capacity", "kv-near-full": "kv-capacity", "itl-tail": "prefill-interference",
    "ttft-high": "prefill-latency", "prefix-hit-low": "prefix-cache",
    "kv-low-while-queued": "admission-limit",
    "cuda-graph-low": "launch-overhead",
}


def build_serving_report(a: ServingAnalysis) -> Report:
    s = a.summary
    metrics: list[ReportMetric] = []
    for key, name in CATALOG_NAMES.items():
        d = catalog.get(name)
        mv = s.values.get(key)
        value = mv.value if mv is not None else None
        if mv is not None and mv.source is not None:
            src = text(mv.source)
        else:
            src = f"absent: {_text(mv.reason) if mv is not None else 'not computed'}"
        metrics.append(ReportMetric(name, value, d.unit, src, d.description))
    findings = [shown_finding(f) for f in a.findings]
    worst = serving_status(a.findings)
    status, status_text = worst.value, STATUS_TEXT[worst]
    limit = next((f for f in findings if f.id in _LIMITS and f.severity != "info"), None)
    if not s.extras.get("records") and s.value("ttft_p99") is None:
        status, status_text = "unknown", "no SGLang batch lines and no latency histograms"
    bottleneck = _LIMITS[limit.id] if limit else "none found"
    reason = limit.title if limit else "no playbook condition holds in the window"
    v = s.value
    server = a.server
    model = (server.arg_str("served_model_name") or server.arg_str("model_path")) if server else None
    headline = (f"{a.job}: {format_value(v('gen_throughput'), 'count')} gen tok/s, "
                f"{format_value(v('input_throughput'), 'count')} prompt tok/s, "
                f"{format_value(v('running_requests'), 'count')} running / "
                f"{format_value(v('queued_requests'), 'count')} queued, KV "
                f"{format_value(v('kv_usage'), 'ratio')}, "
                f"TTFT p99 {format_value(v('ttft_p99'), 'seconds')}, ITL p99 "
                f"{format_value(v('itl_p99'), 'seconds')}"
                f", decode MBU {format_value(v('decode_mbu'), 'ratio')}" + (f" ({model})" if model else ""))
    summary = ReportSummary(a.job, status, status_text, v("decode_mfu"), bottleneck, reason,
                            _text(s.extras.get("window", "")), headline)
    # No training job block: the served model and window are in the headline and the steady text.
    return Report(summary, metrics, findings, [worded_serving_recommendation(r) for r in a.recommendations])


def _text(v: object) -> str:
    """A code's sentence; "None" where there is none (as an absent reason always read)."""
    return text(v) if isinstance(v, Cited) else str(v)


def shown_finding(f: Finding) -> Finding:
    """A serving finding as shown: its title and observation (perfd.report.serving_text), window, source
    and quotes worded (ServingFinding)."""
    if not isinstance(f, ServingFinding):
        return f
    title, obs = finding_words(f.facts) if f.facts is not None else (f.title, f.observation)
    quoted = (text(q) if q is not None else "" for q in f.quotes)
    obs = obs.format(*quoted) if f.quotes else obs
    return dataclasses.replace(f, title=title, observation=obs, span=None, cited=None, quotes=(), facts=None,
                               iterations=text(f.span) if f.span is not None else f.iterations,
                               source=text(f.cited) if f.cited is not None else f.source)


def serving_json(a: ServingAnalysis) -> dict[str, object]:
    """{job, values: {key: {value, source, reason}}, metrics: {catalog name: value}, <extras>, server}:
    the sources, reasons and the extras' sources (the GPUs', the peaks', the window) worded."""
    s = a.summary
    vals = {k: {"value": (mv.value if mv.value is None or math.isfinite(mv.value) else None),
                "source": text(mv.source) if mv.source else None,
                "reason": text(mv.reason) if mv.reason is not None else None}
            for k, mv in s.values.items()}
    extras = {k: text(v) if isinstance(v, Cited) else v for k, v in s.extras.items()}
    return {"job": a.job, "values": vals, "metrics": s.job_metrics(), **extras,
            "server": dataclasses.asdict(a.server) if a.server else None}

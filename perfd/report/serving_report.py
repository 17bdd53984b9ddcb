"""The four-part report of a serving job (Summary, Metrics with sources, Findings with evidence,
Recommendations tied to findings), in the same types as the training report so ``render_text``,
``render_rich`` and ``Report.to_json`` work on it unchanged. Pure."""

from __future__ import annotations

from perfd import catalog
from perfd.analytics.serving.serving_analysis import CATALOG_NAMES, ServingAnalysis
from perfd.analytics.serving.serving_findings import serving_status
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
            src = str(mv.source)
        else:
            src = f"absent: {mv.reason if mv is not None else 'not computed'}"
        metrics.append(ReportMetric(name, value, d.unit, src, d.description))
    status, status_text = serving_status(a.findings)
    limit = next((f for f in a.findings if f.id in _LIMITS and f.severity != "info"), None)
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
                            str(s.extras.get("window", "")), headline)
    # No training job block: the served model and window are in the headline and the steady text.
    return Report(summary, metrics, list(a.findings), list(a.recommendations))

"""Renderers for a Report: plain text (terminals, logs) and a rich renderable. Pure: they return
values, they print nothing."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from perfd.analytics.breakdown.advice_registry import Grade
from perfd.analytics.run.run_summary import REDUCTIONS_TEXT
from perfd.analytics.steps.iteration import job_value
from perfd.core import catalog
from perfd.report import budget_view, plan_view
from perfd.report.grade_text import status_label
from perfd.report.training_report import Report, format_value
from perfd.report.units import tflops

if TYPE_CHECKING:
    from perfd.analytics.run.run_result import RunAnalysis

_SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
# A grade's style (a grade without one, or a serving status, shows unstyled).
_STATUS_STYLE = {Grade.SEVERE.value: "bold red", Grade.COMMUNICATION_OVERHEAD.value: "yellow",
                 Grade.GOOD.value: "green", Grade.EXCELLENT.value: "bold green", Grade.UNKNOWN.value: "dim",
                 Grade.UNGRADED.value: "dim"}


def _wrap(text: str, indent: str, width: int = 100) -> list[str]:
    return textwrap.wrap(text, width=width, initial_indent=indent, subsequent_indent=indent) or [indent]


def render_text(report: Report, iterations: RunAnalysis | None = None, width: int = 100,
                steady_only: bool = False) -> str:
    """The report as plain text, four sections; with ``iterations`` also a per-iteration table (of
    the steady-state iterations only with ``steady_only``)."""
    s = report.summary
    out: list[str] = ["SUMMARY"]
    out += _wrap(s.headline, "  ", width)
    out.append(f"  status: {status_label(s.status)} — {s.status_text}")
    out += _wrap(f"bottleneck: {s.bottleneck} — {s.bottleneck_reason}", "  ", width)
    out.append(f"  steady state: {s.steady}")
    if report.step_budget:
        out.append("")
        out.append("STEP BUDGET (where one step's time goes)")
        out += budget_view.text_lines(report.step_budget, width)
    if report.plan is not None and report.plan.items:
        out.append("")
        out.append("PLAN (apply stage by stage, re-capturing after each; overlaps counted once)")
        for line in plan_view.text_lines(report.plan, plan_view.rec_ids(report.recommendations)):
            lead = len(line) - len(line.lstrip())
            out += textwrap.wrap(line.strip(), width=width, initial_indent=" " * lead,
                                 subsequent_indent=" " * (lead + 3)) or [line]
    out.append("")
    out.append(f"METRICS (steady state: {REDUCTIONS_TEXT})")
    name_w = max((len(m.name) for m in report.metrics), default=10)
    for m in report.metrics:
        out.append(f"  {m.name:<{name_w}}  {format_value(m.value, m.unit):>14}")
        out += _wrap(f"source: {m.source}", " " * 6, width)
    out.append("")
    out.append("FINDINGS")
    if not report.findings:
        out.append("  none")
    for f in report.findings:
        out.append(f"  [{f.severity}] {f.id}: {f.title}")
        out += _wrap(f.observation, " " * 6, width)
        if f.iterations:
            out.append(f"      evidence: {f.iterations}")
    out.append("")
    out.append("RECOMMENDATIONS (by priority)")
    if not report.recommendations:
        out.append("  none")
    for r in report.recommendations:
        out += _wrap(f"{r.priority}. {r.action} (finding {r.finding_id})", "  ", width)
        if r.detail:
            out += _wrap(r.detail, " " * 6, width)
    if iterations is not None:
        out.append("")
        out += _iteration_table(iterations, steady_only)
    return "\n".join(out) + "\n"


def _cell(value: float | None, unit: str) -> str:
    """A table cell: narrower than format_value (ms without unit, TFLOP/s as a number)."""
    if value is None:
        return "-"
    if unit == "seconds":
        return f"{value * 1e3:.1f}"
    if unit == "tflops":
        return tflops(value, 2)
    return format_value(value, unit)


def _iteration_table(analysis: RunAnalysis, steady_only: bool) -> list[str]:
    """One row per iteration; '-' marks an absent value, '*' a steady-state iteration."""
    cols = [(d, d.alias or d.name) for d in catalog.job_metrics(catalog.TABLE)]  # headed by alias
    head = f"{'iter':>6}  " + "  ".join(f"{h:>{max(9, len(h))}}" for _, h in cols)
    rows = ["ITERATIONS (* = steady state, - = absent; step_time in ms, TFLOP/s per GPU)", head]
    for it in analysis.steady_rows() if steady_only else analysis.iterations:
        cells = "  ".join(f"{_cell(job_value(d, it), d.unit):>{max(9, len(h))}}" for d, h in cols)
        rows.append(f"{it.iteration:>5}{'*' if it.steady_state else ' '}  {cells}")
    return rows


def render_rich(report: Report) -> RenderableType:
    """The report as a rich renderable (print it with a rich Console)."""
    s = report.summary
    head = Text()
    head.append(status_label(s.status), style=_STATUS_STYLE.get(s.status, ""))
    head.append(f" — {s.status_text}\n{s.headline}\nbottleneck: {s.bottleneck} — {s.bottleneck_reason}\n"
                f"steady state: {s.steady}")
    metrics = Table(title=f"Metrics (steady state: {REDUCTIONS_TEXT})", show_lines=False, expand=True)
    metrics.add_column("metric", no_wrap=True)
    metrics.add_column("value", justify="right", no_wrap=True)
    metrics.add_column("source", overflow="fold")
    for m in report.metrics:
        metrics.add_row(m.name, format_value(m.value, m.unit), m.source)
    findings = Table(title="Findings", expand=True, show_lines=True)
    findings.add_column("id", no_wrap=True)
    findings.add_column("observation", overflow="fold")
    for f in report.findings:
        findings.add_row(Text(f.id, style=_SEVERITY_STYLE.get(f.severity, "")),
                         f"{f.title}\n{f.observation}\n[{f.iterations}]")
    recs = Table(title="Recommendations", expand=True, show_lines=True)
    recs.add_column("#", justify="right", no_wrap=True)
    recs.add_column("action", overflow="fold")
    recs.add_column("finding", no_wrap=True)
    for r in report.recommendations:
        recs.add_row(str(r.priority), f"{r.action}\n{r.detail}" if r.detail else r.action, r.finding_id)
    parts: list[RenderableType] = [Panel(head, title="Summary")]
    if report.step_budget:
        parts.append(Panel(Text("\n".join(budget_view.text_lines(report.step_budget))), title="Step budget"))
    if report.plan is not None and report.plan.items:
        lines = plan_view.text_lines(report.plan, plan_view.rec_ids(report.recommendations))
        parts.append(Panel(Text("\n".join(lines)), title="Plan"))
    return Group(*parts, metrics, findings, recs)

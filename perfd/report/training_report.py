"""Reports: Summary, Metrics (each with its source), Findings, Recommendations (docs/design.md §2).

``build_report(analysis)`` is pure; renderers turn a Report into text (``render_text``), a rich
renderable (``render_rich``) or JSON (``Report.to_json``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perfd.analytics.advice.plan import Plan
from perfd.analytics.advice.remedies import RemedyId
from perfd.analytics.breakdown.advice_registry import Grade, data_loading
from perfd.analytics.breakdown.budget import StepBudget
from perfd.analytics.finding_types import Finding, Recommendation, Severity, order_findings
from perfd.analytics.incidents.host_evidence import CpuUse
from perfd.analytics.run.arming import ArmingCost
from perfd.analytics.run.run_findings import DATA_LOADING_FINDING, QuotingFinding
from perfd.analytics.run.run_grade import budget_class, explain_grade, grade_mfu
from perfd.analytics.run.run_result import RunAnalysis
from perfd.analytics.run.run_summary import JobBlock, JobLayout, Reduction, reduction
from perfd.analytics.steps.goodput import headline_text
from perfd.analytics.steps.untimed import untimed_groups
from perfd.core import catalog, finite_json
from perfd.core.model import CPU
from perfd.report.bottleneck_text import class_reason
from perfd.report.data_text import DATA_ACTIONS
from perfd.report.finding_text import arming_text, span_text
from perfd.report.grade_text import (
    explanation_text,
    grade_label,
    ungraded_text,
    worded,
    worded_recommendation,
)
from perfd.report.incident_findings import ReportedIncident, incident_findings, is_disturbance
from perfd.report.incident_text import cause_line, cpu_use_text
from perfd.report.provenance_text import line, text
from perfd.report.remedy_text import worded_plan
from perfd.report.row_json import RowCodes, row_codes, run_json
from perfd.report.units import tflops


@dataclass
class ReportSummary:
    job_name: str | None
    status: str  # MFU grade: severe | communication-overhead | good | excellent | impossible | unknown
    status_text: str
    mfu: float | None
    bottleneck: str
    bottleneck_reason: str
    steady: str  # e.g. "iterations 5–40 (36 steady)"
    headline: str


@dataclass
class ReportMetric:
    name: str  # catalog name
    value: float | None
    unit: str
    source: str  # where the number comes from (or why absent)
    description: str = ""


@dataclass
class Report:
    summary: ReportSummary
    metrics: list[ReportMetric]
    findings: list[Finding]
    recommendations: list[Recommendation]
    job: JobBlock | None = None  # the training job's block (a serving report has none)
    step_budget: StepBudget | None = None  # where one step goes (perfd.analytics.breakdown.budget)
    arming: ArmingCost | None = None  # what ncu costs the armed ranks (perfd.analytics.run.arming)
    plan: Plan | None = None  # the remedies as a plan (perfd.analytics.advice.plan)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Report:
        """The inverse of to_json, for a report read as JSON (the aggregator's answer, a file)."""
        return cls(ReportSummary(**d["summary"]), [ReportMetric(**m) for m in d["metrics"]],
                   [Finding(**{**f, "severity": Severity(f["severity"])}) for f in d["findings"]],
                   [Recommendation(**r) for r in d["recommendations"]],
                   step_budget=StepBudget.from_json(d.get("step_budget")),
                   arming=ArmingCost.from_json(d.get("arming")), plan=Plan.from_json(d.get("plan")))

    def to_json(self) -> dict[str, Any]:
        return {
            "summary": plain_json(dataclasses.asdict(self.summary)),
            "metrics": [plain_json(dataclasses.asdict(m)) for m in self.metrics],
            "step_budget": plain_json(self.step_budget.to_json() if self.step_budget is not None else None),
            "arming": plain_json(self.arming.to_json() if self.arming is not None else None),
            "plan": plain_json(self.plan.to_json() if self.plan is not None else None),
            "findings": [plain_json(f.to_json()) for f in self.findings],
            "recommendations": [plain_json(r.to_json()) for r in self.recommendations],
        }


def plain_json(v: object) -> object:
    """Plain JSON values, as the API serves them: a non-finite float is None, keys are strings."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): plain_json(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [plain_json(x) for x in v]
    return v


def format_value(value: float | None, unit: str) -> str:
    """A value in its catalog unit, for humans ("8.4%", "336.8 ms", "82.8 TFLOP/s", "1.31×", "n/a")."""
    if value is None:
        return "n/a"
    if unit == "ratio":
        return f"{value:.1%}"
    if unit == "seconds":
        return f"{value * 1e3:.1f} ms"
    if unit == "times":
        return f"{value:.2f}×"
    if unit == "tflops":
        return f"{tflops(value)} TFLOP/s"
    return f"{value:.4g}"


def layout_text(lay: JobLayout) -> str:
    """The job's layout as its sources stated it: only what is known ("TP=2 PP=1 DP=4, world size 8,
    16 micro-batches"); an unknown size is left out, never printed as None."""
    dims = " ".join(f"{k.upper()}={v}" for k, v in (("tp", lay.tp), ("pp", lay.pp), ("dp", lay.dp),
                                                     ("cp", lay.cp), ("ep", lay.ep), ("vpp", lay.vpp))
                    if v is not None)
    world, micro = lay.world_size, lay.microbatches
    micro_text = f"{micro} micro-batch{'es' if micro != 1 else ''}" if micro is not None else ""
    parts = [p for p in (dims, f"world size {world}" if world is not None else "", micro_text) if p]
    return ", ".join(parts) if parts else "layout unknown"


# How a summary value was taken over the steady steps, as its source says it.
REDUCTION_TEXT: dict[Reduction, str] = {
    Reduction.TIME_WEIGHTED: "time-weighted (Σ over the steps ÷ Σ step time)",
    Reduction.MEAN: "mean", Reduction.MEDIAN: "median"}


def build_report(analysis: RunAnalysis, incidents: Sequence[ReportedIncident] | None = None,
                 *, arming: ArmingCost | None = None, cpu: CpuUse | None = None) -> Report:
    """The four-part report of one analysed run. ``incidents``: the live aggregator's record of
    the job's incidents (with the GPU evidence of the time, kept after the iterations left its
    retention); without it the report uses the incidents the analysis found in the iterations.
    ``arming``: what running under ncu costs the job's armed ranks (the aggregator measures it; else
    the analysis' own measure from its armed steps, perfd.analytics.run.run_figures).
    ``cpu``: how the job's ranks use their CPUs now (the live aggregator's host evidence,
    perfd.analytics.incidents.host_evidence.job_cpu_use): a data-loading action then says more workers only
    where the CPUs have room."""
    s = analysis.summary
    run_s = analysis.run_seconds() or None
    findings = [quoting(worded(f)) for f in analysis.findings]
    recs = [worded_recommendation(r) for r in analysis.recommendations]
    arming = arming if arming is not None else s.arming  # the run's own armed steps measure it offline too
    if incidents is None:  # the incidents the analysis found; its arming finding follows, unordered
        inc_f, inc_r = incident_findings(analysis.incidents, run_s)
        findings, recs = order_findings([*findings, *inc_f], [*recs, *inc_r])
        if arming is not None:
            findings.append(arming_finding(arming))
        if cpu is not None:
            recs = [_with_cpu(r, cpu, analysis.job.device == CPU) for r in recs]
    else:  # the kept incidents (and the CPU use now, for those whose own snapshot has none)
        if arming is not None:
            findings.append(arming_finding(arming))
        if cpu is not None:
            recs = [_with_cpu(r, cpu, analysis.job.device == CPU) for r in recs]
        inc_f, inc_r = incident_findings(incidents, run_s, cpu)
        findings, recs = order_findings([*findings, *inc_f], [*recs, *inc_r])
    incs: list[ReportedIncident] = list(incidents) if incidents is not None else list(analysis.incidents)
    mfu = s.median("mfu")
    grade = grade_mfu(mfu, s.n_steady)
    budget = s.step_budget
    lay = analysis.job.layout
    untimed = untimed_groups(analysis.job.framework, lay.tp, lay.cp, lay.ep)
    grade_text = (ungraded_text(s.n_steady) if grade is Grade.UNGRADED else
                  explanation_text(explain_grade(mfu, s.median("data_share"), s.median("comm_exposed_share"),
                                                 budget_class(budget), untimed, lay.world_size)))
    span = span_text(analysis.steady.span())
    metrics: list[ReportMetric] = []
    for d in catalog.job_metrics(catalog.REPORT):
        value = catalog.median_value(d, s.medians)
        src = _source_of(analysis, d.attr or "")
        if value is not None:
            src = f"{REDUCTION_TEXT[reduction(d.attr or '')]} over {span}; per iteration (last shown): {src}"
        metrics.append(ReportMetric(d.name, value, d.unit, src, d.description))
    job = analysis.job
    gpu = job.gpu
    why = text(gpu.peak_reason) if gpu.peak_reason is not None else "no model FLOPs or peak"
    mfu_text = (f"MFU {format_value(mfu, 'ratio')} ({grade_label(grade)})" if mfu is not None
                else f"MFU unknown ({why})")
    tput = s.median("model_tflops_per_gpu")
    headline = (f"{job.name or 'job'}: {mfu_text}"
                + (f", {format_value(tput, 'tflops')} per GPU" if tput is not None else "")
                + (f" on {gpu.model}" if gpu.model else "")
                + f", bottleneck {s.bottleneck.cls.value}; {layout_text(job.layout)}")
    goodput = headline_text(s.goodput)
    if goodput is not None:
        headline += f"; {goodput}"
    incs = [i for i in incs if not is_disturbance(i)]  # perfd's own capture is never the headline
    costed = [(i.incident, float(c)) for i in incs if isinstance(c := i.incident.cost_s, (int, float))]
    worst = max(costed, key=lambda ic: ic[1], default=None)
    if worst is not None:  # the largest recoverable loss leads
        top, cost = worst
        headline += (f". Largest loss: {cause_line(top)} — {cost:.0f} s lost "
                     f"(iterations {top.first_iteration}–{top.last_iteration}"
                     + (f", {len(incs)} incidents in all" if len(incs) > 1 else "") + ")")
    summary = ReportSummary(job.name, grade.value, grade_text, mfu, s.bottleneck.cls.value,
                            class_reason(s.bottleneck), span, headline)
    return Report(summary, metrics, findings, recs, job, budget, arming, worded_plan(analysis.plan))


def arming_finding(arming: ArmingCost) -> Finding:
    """The report's line on what arming ncu costs (a warning from a tenth of a step on: the job runs
    that much slower for as long as the rank stays armed, a capture or not)."""
    sev = Severity.WARNING if arming.ratio - 1 >= 0.1 else Severity.INFO
    who = f"rank(s) {', '.join(map(str, arming.ranks))}" if arming.ranks else "the armed rank"
    return Finding("ncu-arming-cost", sev, f"Running under ncu: {arming.ratio - 1:+.0%} a step on {who}",
                   arming_text(arming), arming.to_json(),
                   source="the job's step records, armed against " + arming.basis.value.replace("_", " "))


def _with_cpu(r: Recommendation, cpu: CpuUse, cpu_only: bool = False) -> Recommendation:
    """The run's data-loading recommendation with the action its ranks' CPUs call for, and why."""
    if r.finding_id != DATA_LOADING_FINDING and r.remedy != RemedyId.DATA_LOADER.value:
        return r
    dl = data_loading(cpu, cpu_only)
    return dataclasses.replace(r, action=DATA_ACTIONS[dl], data_loading=dl,
                               detail=f"{r.detail}; {cpu_use_text(cpu)}")


def quoting(f: Finding) -> Finding:
    """A finding as shown: one that quotes sentences kept as codes (a metric's source, an
    iteration's exclusion) with them worded after its observation."""
    if isinstance(f, QuotingFinding) and f.quotes:
        said = "; ".join(lead + line(c) for lead, c in f.quotes)
        return dataclasses.replace(f, observation=f.observation + said, quotes=())
    return f


def analysis_json(analysis: RunAnalysis, incidents: Sequence[ReportedIncident] | None = None, *,
                  rows: Iterable[dict[str, Any]] | None = None, codes: RowCodes | None = None,
                  arming: ArmingCost | None = None, cpu: CpuUse | None = None) -> dict[str, Any]:
    """The analysis as JSON with its report: keys job, iterations, iteration_codes, summary,
    incidents, report (what `perfd analyze megatron --json` prints and the aggregator serves; the
    aggregator passes the incidents it kept). ``rows``: the iterations' rows (an iterator for
    finite_json.write to stream, or none), instead of every iteration's as a list; ``codes``: the
    coder that made them (their legend is written after them)."""
    out = {**run_json(analysis, iterations=rows is None),
           "report": build_report(analysis, incidents, arming=arming, cpu=cpu).to_json()}
    if rows is not None:
        out["iterations"] = rows
        out["iteration_codes"] = (finite_json.Lazy(codes.legend) if codes is not None
                                  else row_codes(analysis).legend())
    if incidents is not None:
        out["incidents"] = [i.to_json() for i in incidents]
    return out


def _source_of(analysis: RunAnalysis, key: str) -> str:
    """The source text of a metric, from the last steady iteration that has one."""
    for it in analysis.steady_rows(newest_first=True):
        c = it.sources.get(key)
        src = line(c) if c is not None else None
        if src:
            return src
    return "absent: no steady-state iterations"

"""The report as one self-contained HTML file: charts (inline SVG) and the four-part report.

``render_html(page)`` renders a :class:`Page`: the typed Report with what the charts read of the run
(its iterations, steady state, steady values, goodput, incidents, the aggregator's rank placements), typed.
``Page.of`` makes one from an analysis (offline, from a log); ``page_from_json`` from the JSON of one,
as the aggregator serves it (``/api/jobs/<job>/summary`` joined with ``/api/jobs/<job>/iterations``):
the one place here where JSON is read.
Pure: no I/O, no clock (the caller passes the time it was made), nothing fetched when the page is
opened.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from perfd.analytics.advice.remedies import Framework
from perfd.analytics.run.run_result import RunAnalysis
from perfd.analytics.run.run_summary import (
    REDUCTIONS_TEXT,
    DisturbanceStretch,
    JobBlock,
    RunSummary,
    StepTimeDistribution,
)
from perfd.analytics.steps.goodput import Goodput
from perfd.core import catalog
from perfd.report import budget_view, plan_view
from perfd.report.grade_text import status_label
from perfd.report.incident_findings import ReportedIncident
from perfd.report.picture import (
    CHART_FIELDS,
    MAX_BARS,
    ChartIteration,
    IncidentMark,
    _bins,
    _figure,
    _label,
    _mean,
    _note,
    goodput_bar,
    rank_heatmap,
)
from perfd.report.svg import (
    BLUE,
    GREEN,
    GREY,
    ORANGE,
    PURPLE,
    SKY,
    VERMILLION,
    Series,
    Stack,
    line_chart,
    stacked_bars,
)
from perfd.report.training_report import Report, ReportSummary, format_value, layout_text

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;margin:0;
background:#f6f7f9}
main{max-width:980px;margin:0 auto;padding:18px 24px 40px;background:#fff}
h1{font-size:22px;margin:6px 0 2px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 4px} .meta{color:#555;font-size:13px}
.badge{display:inline-block;padding:2px 10px;border-radius:10px;color:#fff;font-weight:600}
.severe,.critical{background:#b2182b} .communication-overhead,.warning{background:#c77c00}
.good{background:#2b8a3e} .excellent{background:#1b6e2e} .unknown,.ungraded,.info,.impossible{background:#777}
.tiles{display:grid;grid-template-columns:repeat(auto-fill,minmax(170px,1fr));gap:8px;margin:12px 0}
.tile{border:1px solid #ddd;border-radius:6px;padding:8px 10px} .tile b{display:block;font-size:20px}
.tile span{color:#555;font-size:12px}
table{border-collapse:collapse;width:100%;font-size:13px} td,th{border-bottom:1px solid #e4e4e4;
padding:4px 6px;text-align:left;vertical-align:top} td.v{text-align:right;white-space:nowrap}
.src{color:#666;font-size:12px;word-break:break-word} code{font-size:12px}
figure{margin:10px 0 18px} figcaption{color:#555;font-size:12.5px;margin-top:2px}
svg.chart text{font:11px system-ui,sans-serif;fill:#333} svg.chart .axis{font-size:12px;fill:#444}
svg.chart .legend{font-size:12px} svg.chart .note{font-size:11px;fill:#666}
.note{color:#666;font-size:13px;background:#f4f4f4;padding:8px 10px;border-radius:4px}
ol li,ul li{margin-bottom:6px} @media print{body{background:#fff} main{max-width:none}}
"""


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _pct(v: float) -> str:
    return f"{v * 100:.0f}%" if abs(v) >= 0.1 or v == 0 else f"{v * 100:.1f}%"


@dataclass(frozen=True, slots=True, kw_only=True)
class PageSummary:
    """What the charts read of a run summary (perfd.analytics.run.run_summary.RunSummary)."""

    steady_first_iteration: int | None = None
    steady_last_iteration: int | None = None
    warmup_records: int = 0
    step_time_distribution: StepTimeDistribution | None = None
    medians: Mapping[str, float | None] = field(default_factory=dict)
    stretches: tuple[DisturbanceStretch, ...] = ()  # perfd's captures, left out of the steady state

    @classmethod
    def of(cls, s: RunSummary) -> PageSummary:
        return cls(steady_first_iteration=s.steady_first_iteration,
                   steady_last_iteration=s.steady_last_iteration, warmup_records=s.warmup_records,
                   step_time_distribution=s.step_time_distribution,
                   medians=s.medians, stretches=s.capture_disturbances.stretches)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PageSummary:
        a, b = d.get("steady_first_iteration"), d.get("steady_last_iteration")
        meds = d.get("medians")
        cd = d.get("capture_disturbances")
        stretches = cd.get("stretches") if isinstance(cd, Mapping) else None
        return cls(steady_first_iteration=a if isinstance(a, int) else None,
                   steady_last_iteration=b if isinstance(b, int) else None,
                   warmup_records=int(d.get("warmup_records") or 0),
                   step_time_distribution=StepTimeDistribution.from_json(d.get("step_time_distribution_ms")),
                   medians=dict(meds) if isinstance(meds, Mapping) else {},
                   stretches=tuple(st for x in stretches or [] if isinstance(x, Mapping)
                                   and (st := DisturbanceStretch.from_json(x)) is not None))


@dataclass(frozen=True, slots=True, kw_only=True)
class Page:
    """Everything the page shows: the report, the job, and what the charts read of the run."""

    report: Report
    job: JobBlock = field(default_factory=JobBlock)
    summary: PageSummary = field(default_factory=PageSummary)
    iterations: Sequence[ChartIteration] = ()
    incidents: Sequence[IncidentMark] = ()
    # the aggregator's rank placements (heat map rows), as its job summary serves them
    ranks: Sequence[Mapping[str, Any]] = ()
    goodput: Goodput | None = None
    # the live aggregator the page was read from (its URL); None: made offline, from a log
    aggregator: str | None = None

    @classmethod
    def of(cls, analysis: RunAnalysis, report: Report,
           incidents: Sequence[ReportedIncident] | None = None) -> Page:
        """The page of an analysis and its report (``incidents``: those the report was made with)."""
        s = analysis.summary
        return cls(report=report, job=analysis.job, summary=PageSummary.of(s),
                   iterations=[ChartIteration.of(r) for r in analysis.iterations.project(CHART_FIELDS)],
                   incidents=[IncidentMark.of(i.incident)
                              for i in (incidents if incidents is not None else analysis.incidents)],
                   goodput=s.goodput)


def page_from_json(data: Mapping[str, Any], aggregator: str | None = None) -> Page:
    """The page of an analysis read as JSON: {job, iterations, summary, incidents, report} (+ optional
    ``ranks`` and ``goodput``, as ``perfd report`` joins the aggregator's answers; ``aggregator``: the
    URL of the aggregator that served them)."""
    summary = data.get("summary") or {}
    rep = data.get("report") or {}
    report = (Report.from_json(rep) if rep.get("summary") is not None
              else Report(ReportSummary(None, "unknown", "", None, "unknown", "", "", ""), [], [], []))
    return Page(report=report, job=JobBlock.from_json(data.get("job")),
                summary=PageSummary.from_json(summary),
                iterations=[it for d in data.get("iterations") or [] if isinstance(d, Mapping)
                            and (it := ChartIteration.from_json(d)) is not None],
                incidents=[IncidentMark.from_json(d) for d in data.get("incidents") or []
                           if isinstance(d, Mapping)],
                ranks=list(data.get("ranks") or []),
                goodput=Goodput.from_json(data.get("goodput") or summary.get("goodput")),
                aggregator=aggregator)


def _steady_band(summary: PageSummary) -> tuple[float, float, str] | None:
    a, b = summary.steady_first_iteration, summary.steady_last_iteration
    if a is not None and b is not None:
        return (a - 0.5, b + 0.5, f"steady state {a}–{b}")
    return None


def _series(its: Sequence[ChartIteration], key: str,
            scale: float = 1.0) -> list[tuple[float, float | None]]:
    out: list[tuple[float, float | None]] = []
    for it in its:
        v = it.value(key)
        out.append((float(it.iteration), None if v is None else v * scale))
    return out


def _has(its: Sequence[ChartIteration], key: str) -> bool:
    return any(it.value(key) is not None for it in its)


def _step_cap(its: Sequence[ChartIteration]) -> float | None:
    """An axis top that keeps the steady state readable: 1.6× the largest steady step time, used
    only when warm-up or disturbed iterations run far above it."""
    steady = [v for it in its if it.steady_state and (v := it.step_time_ms)]
    every = [v for it in its if (v := it.step_time_ms)]
    if not steady or not every or max(every) <= 2.0 * max(steady):
        return None
    return 1.6 * max(steady)


def _incident_marks(incidents: Sequence[IncidentMark]) -> list[tuple[float, float, str]]:
    out = []
    for inc in incidents:
        a, b = inc.first_iteration, inc.last_iteration
        if a is not None and b is not None:
            cost = inc.cost_s
            lost = f": {cost:.1f} s lost" if cost is not None else ""
            out.append((a - 0.5, b + 0.5, f"incident {inc.id} (iterations {a}–{b}){lost} — {inc.cause}"))
    return out


# What the step time is, by where the job's steps come from (the step-time chart's caption).
_HOOK_STEP_TIME = "the step hook's period: from one step's end to the next's"
STEP_TIME_FROM: Mapping[Framework, str] = {
    Framework.MEGATRON: "Megatron's elapsed time per iteration",
    Framework.TORCHTITAN: "the time between torchtitan's step lines ÷ the steps between them",
    **{f: _HOOK_STEP_TIME for f in Framework if f.hooked},
}


def step_and_mfu_charts(its: Sequence[ChartIteration], summary: PageSummary,
                        incidents: Sequence[IncidentMark] = (),
                        framework: Framework = Framework.MEGATRON) -> str:
    band = _steady_band(summary)
    step = line_chart([Series("step time (ms)", BLUE, _series(its, "step_time_ms"))],
                      title="Step time per iteration", xlabel="iteration", ylabel="step time",
                      yfmt=lambda v: f"{v:g} ms", band=band, y_max=_step_cap(its),
                      marks=_incident_marks(incidents))
    out = [_figure(step, f"Step time per iteration ({STEP_TIME_FROM[framework]}). The shaded "
                   "range is the steady state the medians are taken over; warm-up and disturbed "
                   "iterations are outside it; red ranges are incidents (hover for who, why and the "
                   "time lost); ▲ marks a value above the axis (hover for it).")]
    if _has(its, "mfu"):
        mfu = line_chart([Series("MFU", GREEN, _series(its, "mfu"))], title="MFU per iteration",
                         xlabel="iteration", ylabel="MFU", yfmt=_pct, band=band,
                         hlines=[(0.3, "30%: below is severe"), (0.4, "40%: good"), (0.5, "50%: excellent")])
        out.append(_figure(mfu, "Model FLOPs utilisation: model TFLOP/s per GPU ÷ peak dense TFLOP/s of "
                           "the GPU for the training dtype."))
    else:
        out.append(_note("MFU is absent: the GPU (and so its peak) is unknown. Pass --gpu or "
                         "--peak-tflops, or let the agent's NVML collector report the GPU."))
    return "\n".join(out)


def step_distribution(its: Sequence[ChartIteration], summary: PageSummary) -> str:
    """A histogram of step times after warm-up, with p50/p90/p99 (the tail is where time goes)."""
    dist = summary.step_time_distribution
    first = summary.steady_first_iteration
    warm = summary.warmup_records
    steps = [v for it in its[warm:] if (v := it.step_time_ms) is not None]
    if not steps or dist is None:
        return _note("No step times after warm-up: no distribution.")
    lo, hi = min(steps), max(steps)
    n_bins = min(30, max(5, len(steps) // 4))
    width = (hi - lo) / n_bins or 1.0
    counts = [0] * n_bins
    for v in steps:
        counts[min(n_bins - 1, int((v - lo) / width))] += 1
    labels = [f"{lo + i * width:.0f}" for i in range(n_bins)]
    chart = stacked_bars(labels, [Stack("iterations", BLUE, [float(c) for c in counts])],
                         title="Step time distribution", xlabel="step time (ms, bin start)",
                         ylabel="iterations", yfmt=lambda v: f"{v:.0f}")
    return _figure(chart, f"Step times of {dist.n} iterations after warm-up (incidents included"
                          f"{'' if first is None else '; steady state from ' + str(first)}): p50 "
                          f"{dist.p50:.1f} ms, p90 {dist.p90:.1f} ms, "
                          f"p99 {dist.p99:.1f} ms, max {dist.max:.1f} ms.")


def gpu_table(ranks: Sequence[Mapping[str, Any]], aggregator: str | None = None) -> str:
    """Rank → node/GPU placement with each GPU's latest telemetry (from the live aggregator at
    ``aggregator``; None: the page was made offline, and has none)."""
    if not ranks and aggregator is None:
        return _note("No rank placement: the report was made offline, from a log; the placement and the "
                     "GPUs' telemetry come from a live aggregator (perfd report --aggregator URL).")
    if not ranks:
        return _note(f"No rank placement: the aggregator at {aggregator} has none for this job: its agents "
                     "sent no GPU process lists (the agent needs NVML and the host pid namespace).")
    cols = [m for m in catalog.all_metrics() if catalog.WANDB in m.shows and m.name.startswith("perfd_gpu_")]
    head = "".join(f"<th>{escape(m.short or m.name.removeprefix('perfd_gpu_'))}</th>" for m in cols)
    rows = []
    for r in ranks:
        vals = r.get("gpu_values") or {}
        cells = "".join(f"<td>{escape(format_value(_num(vals.get(m.name)), m.unit))}</td>" for m in cols)
        extra = ", ".join([*(r.get("throttle_reasons") or []),
                           *(f"pid {p.get('pid')} ({p.get('cmdline') or p.get('name')})"
                             for p in r.get("other_processes") or [])])
        rows.append(f"<tr><td>{_e(r.get('rank'))}</td><td>{_e(r.get('node'))}</td><td>{_e(r.get('gpu'))}</td>"
                    f"<td>{_e(r.get('pid'))}</td>{cells}<td>{escape(extra)}</td></tr>")
    return ('<table class="gpus"><tr><th>rank</th><th>node</th><th>GPU</th><th>pid</th>' + head
            + "<th>throttling, other processes</th></tr>" + "".join(rows) + "</table>"
            + '<p class="meta">Latest values the agents sent (NVML and GPM), per rank\'s GPU.</p>')


def breakdown_chart(its: Sequence[ChartIteration]) -> str:
    """Stacked per iteration (ms): data loading, exposed DP comm, exposed PP comm, other exposed
    comm, and the remainder (compute and everything else)."""
    if not _has(its, "step_time_ms"):
        return _note("No step times: no time breakdown.")
    parts = (("data loading", ORANGE, "data_share"), ("exposed DP comm", BLUE, "comm_exposed_dp_share"),
             ("exposed PP comm", SKY, "comm_exposed_pp_share"))
    groups = _bins(its, MAX_BARS)
    labels = [_label(g) for g in groups]
    cols: dict[str, list[float | None]] = {p[0]: [] for p in parts}
    other: list[float | None] = []
    rest: list[float | None] = []
    for g in groups:
        per_it: dict[str, list[float | None]] = {p[0]: [] for p in parts}
        oth: list[float | None] = []
        rem: list[float | None] = []
        for it in g:
            step = it.step_time_ms
            if step is None:
                continue
            shares = {label: it.value(key) for label, _, key in parts}
            for label, v in shares.items():
                per_it[label].append(None if v is None else v * step)
            known = sum(v for v in shares.values() if v is not None)
            total = it.comm_exposed_share
            split = sum(v for k, v in shares.items() if k != "data loading" and v is not None)
            # rows carry 6 significant digits (perfd.report.row_json): a part of 1e-5 of the
            # step is their rounding, not communication
            extra = total - split if total is not None and total - split > 1e-5 else None
            oth.append(None if extra is None else extra * step)
            rem.append(max(0.0, 1.0 - known - (extra or 0.0)) * step)
        for label in cols:
            cols[label].append(_mean(per_it[label]))
        other.append(_mean(oth))
        rest.append(_mean(rem))
    stacks = [Stack(label, color, cols[label]) for label, color, _ in parts if any(cols[label])]
    if any(v for v in other):
        stacks.append(Stack("exposed comm (not split)", PURPLE, other))
    stacks.append(Stack("compute + other (remainder)", GREEN, rest))
    chart = stacked_bars(labels, stacks, title="Time breakdown per iteration", xlabel="iteration",
                         ylabel="time per iteration", yfmt=lambda v: f"{v:.0f} ms", y_max=_step_cap(its))
    binned = " Bars average consecutive iterations." if len(groups) < len(its) else ""
    return _figure(chart, "Where each iteration's time goes (ms). Exposed communication is time the CPU "
                   "timeline waits on communication timers (Σ max across ranks: an upper bound); the "
                   "remainder is compute and everything not attributed. Absent parts are left out, "
                   "never shown as zero." + binned)


def pipeline_chart(its: Sequence[ChartIteration], summary: PageSummary) -> str:
    if not (_has(its, "pp_idle_max") or any((it.pp_bubble_analytic or 0) > 0 for it in its)):
        return ""  # no pipeline parallelism: nothing to show
    series = [Series("analytic bubble", GREY, _series(its, "pp_bubble_analytic"), dashed=True),
              Series("idle, most idle stage", VERMILLION, _series(its, "pp_idle_max")),
              Series("idle, least idle stage", ORANGE, _series(its, "pp_idle_min"))]
    chart = line_chart([s for s in series if any(y is not None for _, y in s.points)],
                       title="Pipeline bubble: analytic vs measured stage idle", xlabel="iteration",
                       ylabel="share of forward-backward", yfmt=_pct, band=_steady_band(summary))
    return _figure(chart, "Analytic bubble (p−1)/(m+p−1) against the measured idle share of each pipeline "
                   "stage; the gap between them is stage imbalance.")


def _e(v: object) -> str:
    return escape(str(v))


def _tiles(med: Mapping[str, float | None]) -> str:
    tiles = [(d.short or d.name, catalog.median_value(d, med), d.unit)
             for d in catalog.job_metrics(catalog.HTML)]
    cells = [f'<div class="tile"><b>{escape(format_value(v, unit))}</b><span>{escape(name)}'
             "</span></div>" for name, v, unit in tiles if v is not None]
    if not cells:
        return ""
    return f'<div class="tiles">{"".join(cells)}</div><p class="meta">Steady state: {REDUCTIONS_TEXT}.</p>'


def summary_section(report: Report) -> str:
    """Part one of the report: status (the MFU grade) and bottleneck class."""
    s = report.summary
    status = s.status or "unknown"
    return "\n".join([
        '<h2 id="summary">Summary</h2>',
        f'<p><span class="badge {_e(status)}">{_e(status_label(status))}</span> {_e(s.status_text)}</p>',
        f"<p><b>{_e(s.headline)}</b></p>",
        f"<p>Bottleneck: <b>{_e(s.bottleneck)}</b> — "
        f"{_e(s.bottleneck_reason)}<br>Steady state: {_e(s.steady)}</p>"])


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def report_sections(report: Report) -> str:
    """Parts two to four: metrics with their sources, findings, recommendations."""
    out = [f'<h2 id="metrics">Metrics (steady state: {REDUCTIONS_TEXT}; each with its source)</h2>']
    rows = []
    for m in report.metrics:
        value = format_value(_finite(_num(m.value)), m.unit)
        rows.append(f"<tr><td><code>{_e(m.name)}</code><div class=src>{_e(m.description)}"
                    f"</div></td><td class=v>{_e(value)}</td>"
                    f"<td class=src>{_e(m.source)}</td></tr>")
    out.append("<table><tr><th>metric</th><th>value</th><th>source</th></tr>" + "".join(rows) + "</table>")
    out.append('<h2 id="findings">Findings</h2>')
    if not report.findings:
        out.append("<p>None.</p>")
    for f in report.findings:
        sev = str(f.severity)
        ev = f" <span class=src>evidence: {_e(f.iterations)}</span>" if f.iterations else ""
        out.append(f'<h3><span class="badge {_e(sev)}">{_e(sev)}</span> {_e(f.title)} '
                   f'<span class=src>({_e(f.id)})</span></h3>'
                   f"<p>{_e(f.observation)}{ev}</p>")
    out.append('<h2 id="recommendations">Recommendations (by priority)</h2>')
    recs = report.recommendations
    if not recs:
        out.append("<p>None.</p>")
    else:
        items = [f"<li><b>{_e(r.action)}</b> <span class=src>(finding "
                 f"{_e(r.finding_id)})</span>"
                 + (f"<br>{_e(r.detail)}" if r.detail else "") + "</li>"
                 for r in sorted(recs, key=lambda r: r.priority)]
        out.append("<ol>" + "".join(items) + "</ol>")
    return "\n".join(out)


def _meta(job: JobBlock) -> str:
    gpu = job.gpu
    peak = _finite(_num(gpu.peak_tflops))
    bits = [f"GPU {gpu.name or gpu.model or 'unknown'}"
            + (f" (peak {peak:g} TFLOP/s {gpu.dtype or ''})" if peak is not None else ""),
            "layout " + layout_text(job.layout)]
    if job.framework:
        bits.append(f"{job.framework} {job.framework_version or ''}".strip())
    return " · ".join(escape(str(b)) for b in bits)


def render_html(page: Page, *, source: str = "", generated: str = "", version: str = "") -> str:
    """The whole page."""
    job, summary, report = page.job, page.summary, page.report
    its = sorted(page.iterations, key=lambda it: it.iteration)
    name = str(job.name or report.summary.job_name or "job")
    meds = summary.medians
    framework = Framework.of(job.framework)
    charts = ['<h3 id="goodput">Where the wall time went</h3>', goodput_bar(page.goodput),
              step_and_mfu_charts(its, summary, page.incidents, framework),
              '<h3 id="distribution">Step time distribution</h3>', step_distribution(its, summary),
              '<h3 id="gpus">GPUs</h3>', gpu_table(page.ranks, page.aggregator),
              '<h3 id="breakdown">Time breakdown</h3>', breakdown_chart(its),
              '<h3 id="heatmap">Per-rank heat map</h3>',
              rank_heatmap(its, page.ranks, job.layout, summary.stretches, page.incidents, framework)]
    pp = pipeline_chart(its, summary)
    if pp:
        charts += ['<h3 id="pipeline">Pipeline bubble</h3>', pp]
    if not its:
        charts = [_note("No analysed iterations yet: no charts.")]
    foot = " · ".join(x for x in (f"perfd {version}" if version else "",
                                  f"source: {source}" if source else "",
                                  f"generated {generated}" if generated else "") if x)
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>perfd report: {escape(name)}</title><style>{_CSS}</style></head><body><main>",
        f"<h1>perfd report: {escape(name)}</h1>", f'<p class="meta">{_meta(job)}</p>',
        f'<p class="meta">{len(its)} iterations analysed · {_e(foot)}</p>',
        summary_section(report), _tiles(meds), budget_view.html_section(report.step_budget),
        plan_view.html_section(report.plan, plan_view.rec_ids(report.recommendations)),
        '<h2 id="charts">Charts</h2>', *charts,
        report_sections(report),
        "</main></body></html>", ""])

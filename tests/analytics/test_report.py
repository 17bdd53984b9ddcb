"""Reports: grade boundaries, the four parts, metric sources, renderers."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest
from rich.console import Console

from perfd.analytics.breakdown.advice_registry import Grade
from perfd.analytics.run.run_analysis import analyze_run
from perfd.analytics.run.run_facts import DataShareFacts, RunFinding
from perfd.analytics.run.run_findings import derive_findings
from perfd.analytics.run.run_grade import (
    CrosscheckFacts,
    CrosscheckRecommendation,
    MfuFacts,
    MfuFinding,
    grade_mfu,
)
from perfd.core import catalog
from perfd.report import Report, build_report, render_rich, render_text
from perfd.report.grade_text import worded
from tests.analytics.analytics_helpers import fixture_job, fixture_records


@pytest.mark.parametrize(("mfu", "grade"), [
    (0.0, "severe"), (0.2999, "severe"), (0.30, "communication-overhead"), (0.3999, "communication-overhead"),
    (0.40, "good"), (0.50, "good"), (0.5001, "excellent"), (0.9, "excellent"), (None, "unknown"),
])
def test_grade_boundaries(mfu: float | None, grade: str) -> None:
    assert grade_mfu(mfu) == grade


def _report() -> Report:
    return build_report(analyze_run(fixture_job(), fixture_records(), gpu_name="NVIDIA H200"))


def test_fixture_report_parts() -> None:
    rep = _report()
    assert rep.summary.status == "severe" and rep.summary.bottleneck == "pipeline-bound"
    assert rep.summary.mfu == pytest.approx(0.0818, abs=1e-4)  # FLOPs summed over time summed
    assert "TP=1 PP=2 DP=1" in rep.summary.headline and "16 micro-batches" in rep.summary.headline
    by_name = {m.name: m for m in rep.metrics}
    for m in rep.metrics:
        catalog.get(m.name)  # every reported metric is in the catalog
        assert m.source and m.unit == catalog.get(m.name).unit
    assert by_name["perfd_job_step_time_seconds"].value == pytest.approx(0.34453, abs=1e-5)  # the mean step
    assert by_name["perfd_job_pp_bubble_analytic_ratio"].value == pytest.approx(1 / 17)
    assert "inference" in by_name["perfd_job_pp_stage_idle_max_ratio"].source
    assert "time-weighted (Σ over the steps ÷ Σ step time) over iterations 5–40" in \
        by_name["perfd_job_mfu_ratio"].source
    assert "median over iterations 5–40" in by_name["perfd_job_lm_loss"].source
    assert "mean over iterations 5–40" in by_name["perfd_job_step_time_seconds"].source
    assert rep.findings[0].severity == "critical"  # sorted by severity
    assert rep.recommendations[0].finding_id == "pp-imbalance"


def test_the_30_40_band_is_no_cause_in_the_headline() -> None:
    """The 30–40% grade is named for its usual cause; beside the MFU it would read as the job's.
    (Seen on the H100: a hook job at 37.7% with 0.2% communication read "MFU 37.7%
    (communication-overhead)".) The status keeps the grade; the headline says "fair"; with its
    communication measured small the grade's text says so."""
    a = analyze_run(fixture_job(), fixture_records(), gpu_name="NVIDIA H200")
    a.summary = dataclasses.replace(a.summary, medians={**a.summary.medians, "mfu": 0.377,
                                                         "comm_exposed_share": 0.002})
    rep = build_report(a)
    assert rep.summary.status == "communication-overhead"
    assert "MFU 37.7% (fair)" in rep.summary.headline and "communication-overhead" not in rep.summary.headline
    assert "not here: exposed communication 0.2%" in rep.summary.status_text
    # The finding's title is a headline too (seen on the H100: a 1-GPU loop's "MFU 38.7%:
    # communication-overhead"); its evidence keeps the grade.
    (grade,) = [f for f in derive_findings(a, fixture_job())[0] if f.id == "mfu-grade"]
    assert isinstance(grade, MfuFinding) and isinstance(grade.facts, MfuFacts) and grade.title == ""
    said = grade.facts.explanation
    assert said is not None and said.grade is Grade.COMMUNICATION_OVERHEAD
    assert worded(grade).title == "MFU 37.7%: fair" and grade.evidence["grade"] == "communication-overhead"
    a.summary = dataclasses.replace(a.summary, medians={**a.summary.medians, "comm_exposed_share": 0.15})
    assert build_report(a).summary.status_text == "MFU 30–40%: communication overhead"


def test_a_throughput_disagreement_is_typed_and_the_report_words_it() -> None:
    """perfd's FLOPs against the logged throughput: the analysis holds the counts and the gap, the
    report the sentences (golden title and action)."""
    job = fixture_job()
    job.spec.padded_vocab_size = 4 * (job.spec.padded_vocab_size or 1)  # a spec perfd reads wrong
    a = analyze_run(job, fixture_records(), gpu_name="NVIDIA H100 80GB HBM3")
    (f,) = [f for f in a.findings if f.id == "tflops-crosscheck"]
    (r,) = [r for r in a.recommendations if r.finding_id == "tflops-crosscheck"]
    assert isinstance(f, MfuFinding) and isinstance(f.facts, CrosscheckFacts) and f.title == ""
    assert not f.facts.agrees and f.facts.n_disagree == f.facts.n_checked > 0
    assert isinstance(r, CrosscheckRecommendation) and r.action == ""
    rep = build_report(a)
    (shown,) = [f for f in rep.findings if f.id == "tflops-crosscheck"]
    assert shown.title == "perfd FLOPs disagree with Megatron's logged throughput"
    (said,) = [r for r in rep.recommendations if r.finding_id == "tflops-crosscheck"]
    assert said.action.startswith("Check the model spec perfd read")
    assert said.detail.endswith(f"on {f.facts.n_disagree} iterations")


def test_render_text_and_json() -> None:
    rep = _report()
    text = render_text(rep)
    for section in ("SUMMARY", "METRICS", "FINDINGS", "RECOMMENDATIONS"):
        assert section in text
    assert "perfd_job_mfu_ratio" in text and "8.2%" in text and "1.31×" in text
    assert "1. Rebalance layers" in text
    doc = rep.to_json()
    assert set(doc) == {"summary", "metrics", "step_budget", "arming", "findings", "recommendations", "plan"}
    assert doc["arming"] is None  # no rank under ncu: unmeasured, never zero
    assert doc["summary"]["status"] == "severe"
    assert doc["recommendations"][0]["finding_id"] == "pp-imbalance"
    json.dumps(doc, allow_nan=False)


def test_render_rich() -> None:
    buf = io.StringIO()
    Console(file=buf, width=140, color_system=None).print(render_rich(_report()))
    out = buf.getvalue()
    assert "Summary" in out and "Recommendations" in out and "pp-imbalance" in out


def test_absent_metrics_render_as_na_not_zero() -> None:
    rep = build_report(analyze_run(fixture_job(), fixture_records(), gpu_name=None))
    mfu = next(m for m in rep.metrics if m.name == "perfd_job_mfu_ratio")
    assert mfu.value is None and mfu.source.startswith("absent")
    assert rep.summary.status == "unknown"
    assert "perfd_job_mfu_ratio" in render_text(rep) and "n/a" in render_text(rep)
    assert rep.to_json()["summary"]["mfu"] is None


def test_report_property_and_iteration_table() -> None:
    a = analyze_run(fixture_job(), fixture_records(), gpu_name="NVIDIA H200")
    assert build_report(a).to_json() == build_report(a).to_json()
    text = render_text(build_report(a), iterations=a)
    assert "ITERATIONS" in text
    row38 = next(line for line in text.splitlines() if line.lstrip().startswith("38*"))
    assert "331.1" in row38 and "84.20" in row38 and "84.21" in row38 and "1.29×" in row38
    row1 = next(line for line in text.splitlines() if line.lstrip().startswith("1 "))
    assert "5868.0" in row1  # warm-up: listed, not starred
    assert "ITERATIONS" not in render_text(build_report(a))


def test_catalog_all_metrics() -> None:
    assert catalog.all_metrics() == catalog.CATALOG


def test_the_same_action_is_recommended_once_and_a_hook_jobs_data_finding_names_its_timer() -> None:
    """The H100 hook job with slow data listed "Speed up data loading" twice (its incident's and the
    run's data share), in two wordings, and its data finding read "batch-generator … megatron
    timer": one action now, said once; the finding names the timer the hook measured."""
    from perfd.analytics.finding_types import DataAction, DataLoading, Recommendation, order_findings
    from perfd.core.model import JobInfo, Provenance, StepRecord, TimerValue
    from perfd.report.data_text import DATA_LOADING_ACTION

    load = DataLoading(DataAction.LOAD_FASTER)
    recs = [Recommendation("", "data-loading", 0, DATA_LOADING_ACTION, "", 0.18, data_loading=load),
            Recommendation("", "incident-inc-80", 0, "said otherwise", "", 0.6, data_loading=load),
            Recommendation("", "other", 0, "Something else", "", 0.1),
            Recommendation("", "other-2", 0, "Something else", "", 0.05),
            Recommendation("", "cpu-only", 0, DATA_LOADING_ACTION, "", 0.01,
                           data_loading=DataLoading(DataAction.LOAD_FASTER, cpu_only=True))]
    _, out = order_findings([], recs)
    # merged on the typed action, never on the words: the same words without it are two actions
    assert [(r.finding_id, r.id) for r in out] == [("incident-inc-80", "R1"), ("other", "R2"),
                                                   ("other-2", "R3"), ("cpu-only", "R4")]

    records = [StepRecord("h", it, rank="all", end_time=1000.0 + 0.05 * it, step_time_ms=50.0,
                          timers={"data-wait": TimerValue(12.0, 12.0, {0: 12.0})},
                          source=Provenance("hook", f"rank0:{it}")) for it in range(1, 61)]
    a = analyze_run(JobInfo(framework="hook"), records)
    data = next(f for f in a.findings if f.id == "data-loading")
    assert isinstance(data, RunFinding) and isinstance(data.facts, DataShareFacts)
    assert data.facts.timer == "data-wait"  # the hook's timer, as the finding names it
    assert "data-wait" in worded(data).observation and "batch-generator" not in worded(data).observation
    assert data.facts.source == "hook" and worded(data).source == "hook timer data-wait"
    assert [r.action for r in build_report(a).recommendations].count(DATA_LOADING_ACTION) == 1

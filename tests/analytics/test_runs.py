"""Runs of a job: a restart from iteration 1 or a resume from a checkpoint
begins a new run; every figure is one run's; an armed run's steps are the profiler's; the same answer
offline and live; no grade from too few steady steps. On logs cut from a real H100 recording
(tests/analytics/runs_fixture.py says how)."""

from __future__ import annotations

import dataclasses

import pytest

from perfd.aggregator.state import AggregatorState
from perfd.analytics.breakdown.bottleneck import TooFewSteps
from perfd.analytics.run.arming import ArmingBasis
from perfd.analytics.run.run_result import RunAnalysis
from perfd.analytics.run.runs import FiguresFrom
from perfd.analytics.steps.steady import Exclusion
from perfd.app.commands.megatron_offline import analyze_stream
from perfd.collectors.megatron import parse_lines
from perfd.core.armed import armed_line, armed_rank
from perfd.core.model import StepRecord
from perfd.report import build_report
from perfd.report.bottleneck_text import class_reason
from perfd.report.grade_text import worded
from tests.analytics.runs_fixture import ARMED_FACTOR, SOURCE, restart_log, resume_log, run1_log

GPU = "NVIDIA H100 80GB HBM3"


def offline(text: str) -> RunAnalysis:
    """``perfd analyze megatron``'s analysis of the log (read as it streams, run by run)."""
    _, a = analyze_stream("-", lambda _p: iter(text.splitlines(keepends=True)), "job", "log", GPU)
    assert a is not None
    return a


def live(text: str) -> RunAnalysis:
    """The live aggregator's analysis after the agent sent the log's records in order."""
    parsed = parse_lines(text.splitlines(keepends=True), job="job")
    state = AggregatorState(gpu_override=GPU)
    state.ingest_job_info("agent", "job", parsed.job_info)
    for rec in parsed.records:  # one record a batch, as a tail sends them while the job runs
        if rec.first_of_run and rec is not parsed.records[0] and rec.end_time is not None:
            # the new run's start-up, sent before its first record (a fresh parser: its own start)
            later = dataclasses.replace(parsed.job_info, started_at=rec.end_time - 30.0)
            state.ingest_job_info("agent", "job", later)
        state.ingest_steps("agent", [rec])
    a = state.analysis("job", force=True)
    assert a is not None
    return a


@pytest.fixture(scope="module")
def run1() -> RunAnalysis:
    return offline(run1_log())


def figures(a: RunAnalysis) -> tuple[object, ...]:
    s = a.summary
    return (s.median("mfu"), s.median("step_time_ms"), s.bottleneck.cls, s.step_time_cv, s.n_steady)


def test_a_restart_from_iteration_1_is_a_new_run_whose_figures_are_its_own(run1: RunAnalysis) -> None:
    a = offline(restart_log(armed=False))
    s = a.summary
    assert s.runs.current == 2 and s.runs.figures is FiguresFrom.CURRENT
    assert s.n_iterations == 20  # run 2's iterations only: run 1's 1-20 are not mixed in (was 40)
    (d,) = s.runs.earlier
    assert (d.run, d.first_iteration, d.last_iteration, d.resumed, d.armed) == (1, 1, 20, False, False)
    assert d.mfu == pytest.approx(run1.summary.median("mfu"))
    assert d.step_time_ms == pytest.approx(run1.summary.median("step_time_ms"))
    gp = s.goodput
    assert gp is not None and gp.runs == 2
    r1 = run1.summary.goodput
    assert r1 is not None
    # Run 1's training is run 1's, never start-up; the second run trains iterations run 1 reached.
    assert gp.parts["startup"] == pytest.approx(r1.parts["startup"])
    assert gp.parts["training"] == pytest.approx(r1.parts["training"], rel=0.01)
    assert gp.parts["redone"] > 0.9 * r1.parts["training"]
    assert gp.parts["restart"] > 30.0


def test_an_armed_restart_reports_the_unarmed_runs_figures_and_measures_the_arming_against_it(
        run1: RunAnalysis) -> None:
    a = offline(restart_log(armed=True))
    s = a.summary
    assert all(a.values("armed"))  # every step of run 2 labelled, from its first
    assert set(s.excluded_kinds.values()) <= {Exclusion.WARMUP, Exclusion.ARMED}
    assert s.runs.figures is FiguresFrom.EARLIER_UNARMED and s.runs.figures_run == 1
    assert figures(a) == figures(run1)  # MFU, step time, class, jitter, steady count: run 1's, exactly
    assert s.arming is not None and s.arming.basis is ArmingBasis.PREVIOUS_RUN
    assert (s.arming.run, s.arming.reference_run) == (2, 1)
    assert s.arming.ratio == pytest.approx(ARMED_FACTOR, rel=0.02)
    # No finding is the arming's own: a jitter finding is run 1's (its CV and span), and the MFU grade
    # is run 1's MFU.
    ids = {f.id: f for f in a.findings}
    assert "run-figures" in ids
    assert ids["mfu-grade"].evidence["mfu"] == pytest.approx(run1.summary.median("mfu"))
    if "step-jitter" in ids:
        assert ids["step-jitter"].evidence["step_time_cv"] == run1.summary.step_time_cv
        assert worded(ids["step-jitter"]).iterations.startswith("run 1:")
    report = build_report(a)
    assert report.arming is not None and report.arming.basis is ArmingBasis.PREVIOUS_RUN
    assert any(f.id == "ncu-arming-cost" for f in report.findings)


def test_an_armed_resume_from_a_checkpoint_is_a_new_run_too(run1: RunAnalysis) -> None:
    a = offline(resume_log(armed=True))
    s = a.summary
    assert s.runs.current == 2 and s.runs.earlier[0].last_iteration == 20
    assert min(a.values("iteration")) == 21 and all(a.values("armed"))
    assert figures(a) == figures(run1)
    assert s.arming is not None and s.arming.basis is ArmingBasis.PREVIOUS_RUN
    # the recording's own run 2, each step ARMED_FACTOR as long, against run 1's steady median
    recs = parse_lines(SOURCE.read_text().splitlines(True)).records
    r2 = [r.step_time_ms for r in recs if r.iteration > 23]
    assert s.arming.armed_ms == pytest.approx(
        sorted(x * ARMED_FACTOR for x in r2 if x is not None)[len(r2) // 2], rel=0.05)
    assert s.goodput is not None and s.goodput.runs == 2 and s.goodput.parts["redone"] == 0.0


@pytest.mark.parametrize("make", [lambda: restart_log(False), lambda: restart_log(True),
                                  lambda: resume_log(False), lambda: resume_log(True)],
                         ids=["restart", "restart-armed", "resume", "resume-armed"])
def test_live_gives_the_same_per_run_answer_as_offline(make: object) -> None:
    text = make()  # type: ignore[operator]
    off, on = offline(text), live(text)
    assert figures(on) == figures(off)
    assert on.summary.runs.to_json() == off.summary.runs.to_json()
    assert (on.summary.arming.to_json() if on.summary.arming else None) == \
        (off.summary.arming.to_json() if off.summary.arming else None)
    g_on, g_off = on.summary.goodput, off.summary.goodput
    assert g_on is not None and g_off is not None and g_on.runs == g_off.runs == 2
    for kind, secs in g_off.parts.items():
        assert g_on.parts[kind] == pytest.approx(secs, abs=0.05), kind
    assert list(on.values("iteration")) == list(off.values("iteration"))


def test_armed_lines_arm_the_run_that_follows_them_only() -> None:
    first, second = run1_log(), run1_log()
    for mark in (armed_line(3, "j"), "==PROF== Connected to process 4242 (/usr/bin/python3.12)"):
        recs = parse_lines((first + mark + "\n" + second + second).splitlines(True)).records
        runs = [[r for r in recs[i * 20:(i + 1) * 20]] for i in range(3)]
        assert [all(r.armed for r in run) for run in runs] == [False, True, False]
        assert [any(r.armed for r in run) for run in runs] == [False, True, False]


def test_the_armed_line_reads_back_as_the_rank_it_was_written_for() -> None:
    """perfd ncu-exec's line is a declared format (perfd.core.armed): written and read from one head, behind
    whatever prefix a launcher puts before the rank's output; ncu's banner names no rank."""
    assert armed_rank(armed_line(3, "j")) == 3
    assert armed_rank("[default3]:" + armed_line(12, "job a")) == 12
    assert armed_rank("==PROF== Connected to process 4242 (/usr/bin/python3.12)") == -1
    assert armed_rank("the armed rank refuses it") is None


def test_a_grade_from_fewer_steady_steps_than_the_minimum_is_not_given() -> None:
    # the first 4 iterations of the recording: 3 warm-up, 1 steady (it was graded "severe" before)
    lines = run1_log().splitlines(keepends=True)
    cut = next(i for i, ln in enumerate(lines) if "iteration        5/" in ln)
    a = offline("".join(lines[:cut]))
    s = a.summary
    assert s.n_steady == 1 and s.median("mfu") is not None
    ids = {f.id for f in a.findings}
    assert "mfu-grade" not in ids and "mfu-too-few-steps" in ids
    assert s.bottleneck.cls.value == "unknown" and s.bottleneck.reason == TooFewSteps(1)
    assert class_reason(s.bottleneck) == "too few steady steps to grade: 1 seen, at least 5 needed"
    assert s.step_time_cv is None and "step-jitter" not in ids
    # The report grades no MFU either (its status and headline said "severe"), and says why in words.
    r = build_report(a)
    assert r.summary.status == "ungraded" and "(not graded)" in r.summary.headline
    assert r.summary.status_text == "MFU not graded: too few steady steps to grade: 1 seen, at least 5 needed"
    said = [r.summary.status_text, r.summary.bottleneck_reason, r.summary.headline,
            *(f.title + f.observation for f in r.findings)]
    assert not any("severe" in x or "perfd." in x or "MIN_GRADE_STEPS" in x for x in said), said


def test_a_late_record_of_an_ended_hook_run_is_refused() -> None:
    state = AggregatorState()

    def rec(it: int, pid: int, t: float) -> StepRecord:
        from perfd.core.model import Provenance
        return StepRecord("h", it, rank=0, end_time=t, step_time_ms=100.0, interval=1,
                          fields={"pid": str(pid)}, source=Provenance("hook", f"rank0:pid{pid}"))

    state.ingest_steps("a", [rec(i, 11, 1000.0 + i * 0.1) for i in range(1, 30)])
    state.ingest_steps("a", [rec(1, 22, 2000.0)])  # the restarted process: run 2
    out = state.ingest_steps("a", [rec(30, 11, 1003.0)])  # run 1's last record, delivered late
    assert out.refused and state.job_stats.ended_run_records == 1
    a = state.analysis("h", force=True)
    assert a is not None and list(a.values("iteration")) == [1]
    assert a.summary.runs.current == 2 and a.summary.runs.earlier[0].last_iteration == 29


def test_a_runs_incidents_close_with_it_and_are_never_merged_into_the_next_runs() -> None:
    state = AggregatorState()
    from perfd.analytics.incidents.detect import Incident

    inc = Incident(id="inc-24", first_iteration=24, last_iteration=80, kinds=["slow"], ranks=[],
                   n_iterations=57, cost_s=3.0, steady_step_ms=500.0, median_step_ms=900.0,
                   max_step_ms=1200.0,
                   start_time=1.0, end_time=None, open=True, cause="slow")
    state.incidents.update("j", [inc], lambda i: {}, [], 10.0)
    state.incidents.retire_run("j", 1, 20.0)
    (kept,) = state.incidents.typed_incidents("j")
    assert not kept.open and kept.run == 1 and kept.to_json()["run"] == 1
    again = dataclasses.replace(inc, cost_s=1.0)  # run 2's incident over the same iteration numbers
    state.incidents.update("j", [again], lambda i: {}, [], 30.0)
    got = state.incidents.typed_incidents("j")
    assert len(got) == 2 and {g.run for g in got} == {1, None}


@pytest.mark.parametrize("hook_first", [True, False], ids=["hook-first", "log-first"])
def test_one_restart_seen_by_the_hook_and_the_log_is_one_new_run(hook_first: bool) -> None:
    """perfd.hook.megatron's per-rank records (a new pid) and the log's start-up marked record both say
    the job restarted: whichever comes first begins run 2, the other is its first record, not run 3."""
    from perfd.core.model import Provenance

    state = AggregatorState()

    def hook(it: int, pid: int) -> StepRecord:
        return StepRecord("m", it, rank=0, end_time=1000.0 * pid + it, step_time_ms=100.0, interval=1,
                          fields={"pid": str(pid)}, source=Provenance("hook", f"rank0:pid{pid}"))

    def log(it: int, first: bool, t: float) -> StepRecord:
        return StepRecord("m", it, end_time=t, step_time_ms=100.0, first_of_run=first)

    for i in range(1, 21):
        state.ingest_steps("a", [log(i, i == 1, 1000.0 + i), hook(i, 1)])
    second = [hook(1, 2), log(1, True, 2001.0)]
    state.ingest_steps("a", second if hook_first else second[::-1])
    for i in range(2, 11):
        state.ingest_steps("a", [log(i, False, 2000.0 + i), hook(i, 2)])
    assert state.job_stats.new_runs == 1
    a = state.analysis("m", force=True)
    assert a is not None and a.summary.runs.current == 2 and len(a.summary.runs.earlier) == 1
    assert list(a.values("iteration")) == list(range(1, 11))

"""The real H100 recording of the ncu workflow
(docs/evidence/entries/29-the-documented-ncu-workflow-both-ways-each-figure-from-its-r.md;
tests/analytics/ncu_workflow_data.py): the job's three runs replayed through the aggregator as its agent sent
them, each figure from its run.

- An aggregator restarted over its state directory (one per run, as the GPU script ran it) keeps the
  job's GPU model: run 1, digested when the resumed run 3 replaced run 2's records, keeps its MFU, and
  run 3's figures are run 1's (the H100 read MFU null for run 3: its aggregator digested run 1 before
  an agent had named the GPU again).
- Goodput books each run's time by what it was, checked by hand against the logs' own times: run 1's
  iterations 1-45 trained, run 2's repeat of 1-29 redone, run 3's 46-85 trained; of an armed step (its
  rank under ncu) the excess over run 1's steady step is perfd's profiling. The parts add up to the wall
  time. (The H100 read training 0.0 s after run 2: run 2's range had been taken out of run 1's
  training.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from perfd.aggregator.capture_records import CaptureRecord
from perfd.aggregator.state import AggregatorState
from perfd.analytics.run.run_grade import MfuFacts, MfuFinding, MfuSaid
from perfd.analytics.run.run_result import RunAnalysis
from perfd.analytics.run.runs import FiguresFrom
from perfd.collectors.megatron import parse_lines
from perfd.core.model import CaptureStatus, JobInfo, StepRecord
from perfd.report.grade_text import worded
from tests.analytics.ncu_workflow_data import (
    GPU,
    JOB,
    RUNS,
    between,
    capture_windows,
    log_text,
    run1_steady_median_s,
    run_of,
    trained,
)

# Its tests share what the module computes once: one xdist worker runs them (conftest.py)
pytestmark = pytest.mark.xdist_group("ncu_workflow")

AGENT = "vm/ncu-workflow"


def windows() -> list[CaptureRecord]:
    """The recording's captures: each one's record as far as its window goes (it started and finished;
    no result, bottleneck or arming of its own)."""
    return [CaptureRecord(id=f"c{i}", job=JOB, ranks=None, tool="ncu", steps=0, origin="manual",
                          requested_at=a, status=CaptureStatus.FINISHED, started_at=a, finished_at=b)
            for i, (a, b) in enumerate(capture_windows())]


def parsed(run: int) -> tuple[JobInfo, list[StepRecord]]:
    """The run's job info and step records as the agent's Megatron-LM collector reads its log."""
    p = parse_lines(log_text(run).splitlines(keepends=True), job=JOB)
    return p.job_info, list(p.records)


def live_state(upto: int) -> tuple[AggregatorState, list[RunAnalysis]]:
    """The aggregator after runs 1..``upto`` arrived in order (job info before each run's records, one
    record a batch), the captures' windows as the capture records give them; an analysis after each run."""
    state = AggregatorState(gpu_override=GPU)
    state.capture_book.restore(windows())
    out = []
    for run in RUNS[:upto]:
        info, records = parsed(run)
        state.ingest_job_info(AGENT, JOB, info)
        for rec in records:
            state.ingest_steps(AGENT, [rec])
        a = state.analysis(JOB, force=True)
        assert a is not None
        out.append(a)
    return state, out


@pytest.fixture(scope="module")
def analyses() -> list[RunAnalysis]:
    return live_state(3)[1]


def figures(a: RunAnalysis) -> tuple[object, ...]:
    s = a.summary
    return s.median("mfu"), s.median("step_time_ms"), s.bottleneck.cls


def test_the_armed_runs_report_run_1s_figures_and_its_arming_against_run_1(
        analyses: list[RunAnalysis]) -> None:
    run1, run2, run3 = analyses
    assert run1.summary.median("mfu") == pytest.approx(0.0372, abs=0.0001)  # the H100 run's 3.72%
    for a, run in ((run2, 2), (run3, 3)):
        s = a.summary
        assert (s.runs.current, s.runs.figures, s.runs.figures_run) == (run, FiguresFrom.EARLIER_UNARMED, 1)
        assert figures(a) == figures(run1)
        assert s.arming is not None and s.arming.reference_ms == pytest.approx(run1_steady_median_s() * 1e3)
    # run 3 resumed at 46: every step armed, the first not a repeat of run 2's
    assert min(run3.values("iteration")) == 46 and all(run3.values("armed"))


def test_goodput_books_each_run_by_hand_and_adds_up(analyses: list[RunAnalysis]) -> None:
    run1, _, run3 = analyses
    ref = run1_steady_median_s()  # an armed step's excess over it is perfd's
    r1, r2, r3 = (run_of(r) for r in RUNS)
    g1, g2, g3 = (a.summary.goodput for a in analyses)
    assert g1 is not None and g2 is not None and g3 is not None

    start = r1.first_stamp
    startup = r1.steps[0].end - r1.steps[0].step_s - start
    run1_steps = sum(t for _, t in trained(1))
    capture1 = run1.summary.capture_disturbances.excess_s  # the Kineto capture's excess (iterations 25-42)
    assert capture1 is not None and 1.0 < capture1 < 5.0
    end1 = r1.steps[-1].end + r1.save_s

    def own_and_perfd(run: int) -> tuple[float, float]:
        own = sum(t * ref / s.step_s for s, t in trained(run))
        return own, sum(t for _, t in trained(run)) - own

    own2, perfd2 = own_and_perfd(2)
    own3, perfd3 = own_and_perfd(3)
    restart2 = r2.steps[0].end - r2.steps[0].step_s - end1
    restart3 = r3.steps[0].end - r3.steps[0].step_s - r2.steps[-1].end
    armed_incidents = sum(i.cost_s or 0.0 for i in run3.incidents)  # slower than the armed level: incident

    expect = {
        1: {"startup": startup, "training": run1_steps - capture1, "profiling": capture1, "redone": 0.0,
            "checkpoint": r1.save_s, "restart": 0.0, "other": between(1), "incident": 0.0},
        2: {"startup": startup, "training": run1_steps - capture1, "profiling": capture1 + perfd2,
            "redone": own2, "checkpoint": r1.save_s, "restart": restart2, "other": between(1) + between(2),
            "incident": 0.0},
        3: {"startup": startup, "training": run1_steps - capture1 + own3,
            "profiling": capture1 + perfd2 + perfd3 - armed_incidents, "redone": own2,
            "checkpoint": r1.save_s, "restart": restart2 + restart3,
            "other": between(1) + between(2) + between(3), "incident": armed_incidents},
    }
    for run, gp, last in ((1, g1, end1), (2, g2, r2.steps[-1].end), (3, g3, r3.steps[-1].end)):
        assert gp.runs == run and gp.start_time == pytest.approx(start, abs=0.01)
        assert gp.wall_s == pytest.approx(last - start, abs=0.05)
        for kind, secs in expect[run].items():
            assert gp.parts[kind] == pytest.approx(secs, abs=0.05), (run, kind)
        assert gp.parts["stall"] == 0.0 and gp.parts["evaluation"] == 0.0
        assert sum(gp.parts.values()) == pytest.approx(gp.wall_s, abs=1e-6)  # the parts add up
    # The figures the H100 got wrong: run 1's training stays training after run 2 (it read 0.0 s) and
    # run 2 is redone at the job's own speed, its excess (the arming, the 78 s range) perfd's.
    assert g2.parts["training"] == pytest.approx(g1.parts["training"]) and g2.parts["training"] > 25.0
    assert 14.0 < g2.parts["redone"] < 16.0 and g2.parts["profiling"] > 100.0
    assert g3.parts["training"] - g2.parts["training"] == pytest.approx(own3, abs=0.05) and own3 > 19.0


def test_a_restarted_aggregator_keeps_the_jobs_gpu_and_run_1s_mfu(tmp_path: Path) -> None:
    """One aggregator per run over one state directory, as on the H100: the journal gives the step
    records and job info back, the GPU model (named only by the NVML samples, which are not kept)
    comes back with the documents, before the first analysis digests the runs the replay closed."""
    from perfd.aggregator.daemon import Aggregator, AggregatorConfig
    from perfd.aggregator.durable import restore, save_documents
    from perfd.core.jobinfo_json import job_info_to_json
    from perfd.core.model import Sample
    from perfd.transport.codec import HelloInfo, decode_batch, encode_batch
    from perfd.transport.gen import perfd_pb2 as pb
    from perfd.transport.series import SeriesTable

    def aggregator() -> Aggregator:
        agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[], state_dir=str(tmp_path)))
        assert agg.store is not None
        restore(agg, agg.store)
        agg.state.capture_book.restore(windows())  # the recording's captures (the coordinator has none)
        return agg

    seq = [0]

    def send(agg: Aggregator, run: int, gpu_named: bool) -> None:
        j = agg.server.journal
        assert j is not None
        j.hello(AGENT, agg._on_hello(HelloInfo(agent_id=AGENT, node="vm", version="", jobs=(JOB,),
                                               capabilities={}, spool_epoch="e", n_series=0)))
        info, records = parsed(run)
        for i, rec in enumerate(records):
            seq[0] += 1
            samples = [Sample("perfd_gpu_memory_total_bytes", 85520809984.0, rec.end_time or 0.0,
                              {"node": "vm", "gpu": "0", "model": GPU})] if gpu_named else []
            said = {JOB: job_info_to_json(info)} if i == 0 else None  # the start-up, before its first record
            b = encode_batch(AGENT, seq[0], samples, [rec], (), SeriesTable(), job_info_json=said)
            kept = agg.on_batch(AGENT, decode_batch(pb.Batch.FromString(b.SerializeToString()), {}))
            j.batch(AGENT, b, kept)
        assert j.commit()

    def done(agg: Aggregator) -> None:
        assert agg.store is not None
        save_documents(agg, agg.store)
        assert agg.store.commit()
        agg.store.close()

    first = aggregator()
    send(first, 1, gpu_named=True)
    a1 = first.state.analysis(JOB, force=True)
    assert a1 is not None and a1.summary.median("mfu") == pytest.approx(0.0372, abs=0.0001)
    done(first)
    second = aggregator()
    send(second, 2, gpu_named=True)
    done(second)
    third = aggregator()  # run 2 replayed closes run 1: digested at the first analysis, no agent yet
    a = third.state.analysis(JOB, force=True)
    assert a is not None and a.summary.runs.current == 2
    send(third, 3, gpu_named=False)  # the agent's first samples come later
    a3 = third.state.analysis(JOB, force=True)
    assert a3 is not None
    s = a3.summary
    assert (s.runs.current, s.runs.figures_run) == (3, 1)
    assert s.runs.earlier[0].mfu == pytest.approx(a1.summary.median("mfu"))  # was None
    assert s.median("mfu") == pytest.approx(a1.summary.median("mfu"))  # run 3's figures: run 1's (was None)
    assert "mfu-grade" in {f.id for f in a3.findings} and "mfu-absent" not in {f.id for f in a3.findings}
    done(third)


def test_mfu_absent_says_why_when_the_figures_are_an_earlier_runs() -> None:
    """A job whose GPU no source named: run 3's figures are run 1's, which has no MFU; the finding says
    that, not the source of run 3's own per-step MFU (the H100's "MFU analytics:model TFLOP/s ...")."""
    state = AggregatorState()
    for run in RUNS:
        info, records = parsed(run)
        state.ingest_job_info(AGENT, JOB, info)
        state.ingest_steps(AGENT, records)
    a = state.analysis(JOB, force=True)
    assert a is not None and a.summary.runs.figures_run == 1 and a.summary.median("mfu") is None
    f = next(f for f in a.findings if f.id == "mfu-absent")
    assert isinstance(f, MfuFinding) and isinstance(f.facts, MfuFacts) and f.facts.said is MfuSaid.EARLIER_RUN
    said = worded(f).observation  # golden: the earlier run's digest is why, not a source of this run's
    assert said == ("MFU absent: the figures are run 1's (every step of run 3 is armed), and run 1's digest "
                    "holds no MFU (its GPU or its model FLOPs were unknown when its records were digested)")

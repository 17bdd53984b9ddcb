"""The step budget on recorded real captures: the parts add up, agree with an independent
breakdown of the same trace (HolisticTraceAnalysis' kernel and temporal breakdowns, within 2 points),
and each recorded job gets its class and its own remedies — the big H100 Megatron job memory-bound
with R1 fused attention and its expected gain, the tiny one launch-bound with CUDA graphs, the
data-bound hook job the data loader, the PP=2 job the pipeline."""

from __future__ import annotations

import gzip
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from perfd.analytics.advice.budget_findings import RemedyRecommendation
from perfd.analytics.advice.capture_findings import diagnose_capture
from perfd.analytics.advice.remedies import Advice, Framework
from perfd.analytics.advice.remedy_said import Say, say
from perfd.analytics.breakdown.advice_registry import GradeBasis
from perfd.analytics.breakdown.bottleneck import BottleneckClass, BudgetClass
from perfd.analytics.breakdown.budget import (
    FlopsContext,
    StepBudget,
    TimerShares,
    classify,
    from_timers,
)
from perfd.analytics.breakdown.capture_budget import from_capture
from perfd.analytics.breakdown.device_breakdown import DeviceBreakdown
from perfd.analytics.breakdown.ncu_rows import NcuCategory
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.finding_types import Recommendation
from perfd.analytics.run.run_analysis import analyze_run
from perfd.analytics.run.run_facts import Divider, NextStepFacts, RunRecommendation
from perfd.collectors.megatron import parse_file
from perfd.report.grade_text import worded, worded_recommendation
from perfd.report.remedy_text import worded_remedies, worded_remedy
from tests.trace_cache import analyze_chrome_trace, timeline_class


def _fitted(r: Recommendation) -> Advice:
    """The remedy a recommendation was made of (its words are the report's)."""
    assert isinstance(r, RemedyRecommendation) and r.facts is not None
    return r.facts.advice[0]

DATA = Path(__file__).resolve().parents[1] / "data" / "captures"
KINETO = DATA / "kineto_h100_megatron"
BIG = KINETO / "big2048_rank0.json.gz"
BIG_LOG = KINETO / "big2048_megatron.log"
TINY = KINETO / "tiny_rank0.json.gz"
HOOK = DATA / "hook_h100_data" / "hook_data_rank0.json.gz"
H100 = "NVIDIA H100 80GB HBM3"
TRACES = [BIG, KINETO / "big_rank0.json.gz", TINY, HOOK]


@pytest.mark.slow
@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name)
def test_every_instant_of_the_span_is_in_one_part(trace: Path) -> None:
    dev = analyze_chrome_trace(trace).device(0)
    assert sum(dev.parts_ms.values()) == pytest.approx(dev.span_ms, rel=1e-9)
    assert dev.parts_ms.get("idle_short", 0.0) + dev.parts_ms.get("idle_long", 0.0) == \
        pytest.approx(dev.idle_ms, rel=1e-9)
    b = from_capture(dev, 3)
    assert b is not None and b.step_ms == pytest.approx(dev.span_ms / 3, rel=1e-9)
    assert sum(p.share for p in b.parts) == pytest.approx(1.0)


# --- the independent reference: HolisticTraceAnalysis on the same trace ---------------------------------
# Written out here, apart from perfd's categorizer: which of HTA's per-name kernel sums belong where.
_REF = {"gemm": re.compile(r"^nvjet|gemm|cutlass", re.I),
        "attention": re.compile(r"softmax|masked_fill", re.I), "optimizer": re.compile(r"multi_tensor_apply")}


def _hta(trace: Path, tmp: Path) -> dict[str, float]:
    """Shares of the span from HTA: idle (temporal breakdown), memcpy (MEMORY kernels) and the kernel
    groups above (per-name sums of the kernel breakdown)."""
    from hta.trace_analysis import TraceAnalysis  # type: ignore[import-untyped]

    d = tmp / trace.stem.split(".")[0]
    d.mkdir()
    shutil.copy(trace, d / trace.name)
    logging.disable(logging.WARNING)
    try:
        ta = TraceAnalysis(trace_dir=str(d))
        temporal = ta.get_temporal_breakdown(visualize=False)
        _types, per_name = ta.get_gpu_kernel_breakdown(visualize=False, num_kernels=100_000,
                                                      include_memory_kernels=True)
    finally:
        logging.disable(logging.NOTSET)
    span = float(temporal["kernel_time(us)"].iloc[0])
    out = {"idle": float(temporal["idle_time(us)"].iloc[0]) / span,
           "memcpy": float(per_name[per_name["kernel_type"] == "MEMORY"]["sum (us)"].sum()) / span}
    for part, pat in _REF.items():
        rows = per_name[(per_name["kernel_type"] == "COMPUTATION") & per_name["name"].str.contains(pat)]
        out[part] = float(rows["sum (us)"].sum()) / span
    return out


@pytest.mark.slow
@pytest.mark.parametrize("trace", [BIG, TINY], ids=lambda p: p.name)
def test_budget_parts_agree_with_hta_within_two_points(trace: Path, tmp_path: Path) -> None:
    ref = _hta(trace, tmp_path)
    b = from_capture(analyze_chrome_trace(trace).device(0), None)
    assert b is not None
    ours = {"idle": (b.ms(Part.IDLE_SHORT) + b.ms(Part.IDLE_LONG)) / b.step_ms,
            "memcpy": b.ms(Part.MEMCPY) / b.step_ms, "gemm": b.ms(Part.GEMM) / b.step_ms,
            "attention": b.ms(Part.ATTENTION) / b.step_ms, "optimizer": b.ms(Part.OPTIMIZER) / b.step_ms}
    for k, v in ref.items():
        assert ours[k] == pytest.approx(v, abs=0.02), (k, ours[k], v)
    if trace == BIG:  # what the reference finds on the big job, so that the test cannot pass empty
        assert ref["gemm"] > 0.25 and ref["attention"] > 0.15 and ref["memcpy"] > 0.1 and ref["idle"] > 0.1


# --- the recorded jobs read end to end ----------------------------------------------------------------
OPS = KINETO / "ops_default_rank0.json.gz"  # the same job, its trace with CPU ops
OPS_LOG = KINETO / "ops_megatron.log.gz"


def _big(trace: Path = OPS, log: Path = OPS_LOG) -> Any:
    parsed = parse_file(log, job="big2048")
    return analyze_run(parsed.job_info, parsed.records, gpu_name=H100, job_name="big2048",
                       timeline=timeline_class(str(trace)), live=False)


@pytest.mark.slow
def test_the_big_h100_job_is_memory_bound_in_attention_and_r1_is_fused_attention() -> None:
    """The budget's H100 job
    (docs/evidence/entries/22-why-not-closer-to-the-limit-the-step-budget-on-the-issue-s-h.md; h=2048, 12
    layers, seq 2048, mbs 4, local transformer, no TE, no Apex, 1× H100), captured with its CPU ops
    (docs/evidence/entries/25-remedies-applied-one-at-a-time-on-the-issue-s-h100-job-attri.md): every kernel
    charged to the op that launched it. Attention — its matmuls, mask fill, softmax, dropout and the copies
    autograd makes of the score matrix — is about half the step; the linear layers run at the matmul ceiling;
    the "memory copies" of a by-name reading (90 ms) are a few ms."""
    a = _big()
    s = a.summary.to_json()
    assert s["bottleneck"] == "memory-bound" and a.summary.bottleneck.winner == "capture"
    b = StepBudget.from_json(s["step_budget"])
    # 3 steps marked; the budget is the mean of the 2 complete ones between the first and last mark (the
    # window cut the third step's optimizer phase)
    assert b is not None and b.has_kernels and b.iterations == 2 and b.steps_from == "trace"
    assert b.window is not None and (b.window.marked, b.window.complete) == (3, 2)
    assert [c.part for c in b.window.cut] == [Part.OPTIMIZER]
    assert b.attribution == "ops"
    share = {p.part: p.share for p in b.parts}
    assert 0.45 < share[Part.ATTENTION] < 0.58 and 0.2 < share[Part.LINEAR] < 0.27
    assert share[Part.MEMCPY] < 0.01 and share.get(Part.GEMM) is None
    lin = b.get(Part.LINEAR)
    # the linear layers are not the problem
    assert lin is not None and (lin.detail.get("of_ceiling") or 0.0) > 0.9
    att = b.get(Part.ATTENTION)
    assert att is not None and att.detail["fused"] is False
    assert any("CopySlices" in k for k in att.detail["op_ms"])  # the score matrix's copies are attention's
    f = {x.id: x for x in map(worded_remedies, a.findings)}  # as the report words them
    assert f["budget-gemm"].severity == "info" and "efficient" in f["budget-gemm"].observation
    # Megatron's own optimizer timer is shown beside the optimizer's kernels (host time and copies in it).
    opt = f["budget-optimizer"]
    assert 20 < opt.evidence["ms"] < 30 and 25 < opt.evidence["timer_ms"] < 45
    r1 = a.recommendations[0]
    assert r1.finding_id == "budget-attention" and r1.remedy == "fused_attention"
    # not --attention-backend flash: the start-up shows no flash-attn (TE would use it alone)
    fa = _fitted(r1)
    assert fa.action.code is Say.FUSED_ATTENTION_INSTALL
    assert r1.flags == ["--transformer-impl transformer_engine"]
    assert any(n.code is Say.NOT_FLASH_BACKEND for n in fa.notes)
    shown = worded_remedy(r1)  # as the report words it
    assert shown.action == ("Fused attention: install Transformer Engine, then --transformer-impl "
                            "transformer_engine")
    assert "flash-attn" in shown.detail
    assert r1.needs == ["transformer_engine"] and r1.gain_ms is not None and r1.gain_ms[0] > 0.4 * b.step_ms
    promised = [r.impact for r in a.recommendations if r.impact is not None]
    assert promised == sorted(promised, reverse=True)
    # Nothing asks to check what the report measured as fine (TP=1, data 1.2%, comm 0.2%), and the
    # grade's text does not point at them either.
    for r in map(worded_remedy, a.recommendations):
        assert "tensor parallelism" not in r.action and "data loading" not in r.action.lower()
    assert "usually communication or data loading" not in worded(f["mfu-grade"]).observation


@pytest.mark.slow
def test_a_capture_without_cpu_ops_falls_back_to_kernel_names_and_says_so() -> None:
    """The same job's earlier trace was cut to its GPU events: no op to charge a kernel to. Attention is
    then its softmax and mask-fill kernels only, its matmuls among the GEMMs, and the budget says how it
    was divided."""
    a = _big(BIG, BIG_LOG)
    b = a.summary.step_budget
    assert b is not None and b.attribution == "kernel names" and b.steps_from == "span"
    assert b.get(Part.GEMM) is not None and b.get(Part.LINEAR) is None
    assert 0.15 < b.ms(Part.ATTENTION) / b.step_ms < 0.25  # half of what the ops say: the by-name reading


def test_the_same_trace_gives_the_same_class_with_or_without_the_timers() -> None:
    """Live, the aggregator's capture record is diagnosed in the job's context (its timers); offline
    `perfd analyze trace` has none: the class is the timeline's own either way."""
    dev = analyze_chrome_trace(HOOK).device(0)
    alone = diagnose_capture([dev], iterations=3)
    timed = diagnose_capture([dev], iterations=3, timers=TimerShares(166.0, 0.927))
    assert alone.bottleneck == timed.bottleneck == "sync-bound"
    assert timed.budgets[0].ms(Part.DATA) > 100 and alone.budgets[0].ms(Part.DATA) == 0.0


def test_the_tiny_job_is_launch_bound_with_cuda_graphs_first() -> None:
    d = diagnose_capture([analyze_chrome_trace(TINY).device(0)], iterations=3,
                         framework=Framework.MEGATRON)
    assert d.bottleneck == "launch-overhead" and d.class_shares["launch-overhead"] > 0.9
    r1 = d.recommendations[0]
    assert r1.remedy == "cuda_graphs" and r1.flags == ["--cuda-graph-impl local"]
    assert _fitted(r1).action.code is Say.GRAPHS_FLAG
    assert r1.gain_ms is not None and r1.gain_ms[0] > 0  # launch gaps 96% of the step: graphs pay


def test_the_data_bound_hook_job_gets_the_data_loader_remedy() -> None:
    """The recorded hook job (a slow loader; the H100 run's timers measured the data wait at 92.7% of
    a 166 ms step: docs/evidence/budget_h100/hook_data_run1.json): its step budget, from the
    capture and that data share, puts the long gaps under data wait, and R1 is PyTorch's DataLoader."""
    run = json.loads((Path(__file__).resolve().parents[2] / "docs" / "evidence" / "budget_h100" /
                      "hook_data_run1.json").read_text())
    data = run["after"]["bottleneck_evidence"]["numbers"]["data_share"]
    own = json.loads((HOOK.parent / "own_times.json").read_text())["steps"]
    steady = sorted(ms for i, ms in own if i > 10)
    step = steady[len(steady) // 2]
    d = diagnose_capture([analyze_chrome_trace(HOOK).device(0)], iterations=3,
                         framework=Framework.PYTORCH, timers=TimerShares(step, data))
    b = d.budgets[0]
    assert b.ms(Part.DATA) / b.step_ms > 0.8
    r1 = d.recommendations[0]
    assert r1.finding_id == "budget-data-0" and say(Say.DATA_KNOBS, "pytorch") in _fitted(r1).notes
    assert "DataLoader(num_workers" in worded_remedy(r1).detail


def test_the_pp2_job_gets_the_pipeline_remedies_from_its_timers() -> None:
    """The shared real PP=2 log (2× H200, m=16): no capture, so the budget is the timers'; the pipeline
    is its measured loss and its remedies lead (imbalance first: it is the larger part)."""
    fixture = (Path(__file__).resolve().parents[2] / "perfd" / "app" / "demo" / "data"
               / "megatron_h200x2_tp1_pp2.log")
    parsed = parse_file(fixture, job="pp2")
    a = analyze_run(parsed.job_info, parsed.records, gpu_name="NVIDIA H200", job_name="pp2")
    assert a.summary.bottleneck.cls.value == "pipeline-bound"
    b = a.summary.step_budget
    assert b is not None and not b.has_kernels and b.ms(Part.PIPELINE) > 0.1 * b.step_ms
    assert a.recommendations[0].finding_id in ("pp-imbalance", "pp-bubble")
    assert any(r.finding_id == "mfu-grade" and isinstance(r, RunRecommendation)
               and isinstance(r.facts, NextStepFacts) for r in a.recommendations)  # divide the compute


def test_a_timers_only_budget_adds_up_and_keeps_compute_whole() -> None:
    b = from_timers(TimerShares(700.0, 0.02, 0.01, None, 30.0, 0.2))
    assert b is not None and b.step_ms == pytest.approx(700.0)
    assert b.ms(Part.COMPUTE) == pytest.approx(700 - 14 - 7 - 30)
    assert classify(b) is None  # the timers do not see the kernels: no class from them here


def test_an_unreadable_budget_is_absent_not_zero() -> None:
    assert StepBudget.from_json({"step_ms": "x"}) is None and StepBudget.from_json(None) is None
    bare = DeviceBreakdown.from_json({"device": 0})
    assert bare is not None and from_capture(bare, 3) is None  # no breakdown: no budget, not an empty one
    assert DeviceBreakdown.from_json({"span_ms": 1.0}) is None  # no device: not a device's breakdown
    assert from_timers(TimerShares(700.0, None, 0.01)) is None  # a missing data share: no budget


@pytest.mark.slow
def test_trace_for_tests_is_what_its_readme_says() -> None:
    readme = (KINETO / "README.md").read_text()
    assert "big2048_rank0.json.gz" in readme and "seq 2048" in readme
    with gzip.open(BIG, "rt") as f:
        doc = json.load(f)
    assert {e.get("cat") for e in doc["traceEvents"] if e.get("ph") == "X"} <= {"kernel", "gpu_memcpy",
                                                                                "gpu_memset"}


@pytest.mark.slow
def test_an_ncu_capture_adds_its_kernel_figures_to_the_budget_parts() -> None:
    """An Nsight Compute capture's per-category summaries (the recorded H100 ncu export, joined to the
    recorded Kineto trace of the job) sit on the parts their kernels' time is in, and the GEMM
    finding says what ncu measured of them."""
    from perfd.analytics.advice.budget_findings import BudgetContext, analyze
    from perfd.analytics.breakdown.job_budget import with_ncu
    from perfd.analytics.ncu import join as ncu_join
    from perfd.capture.ncu_report import parse_csv
    from perfd.report.budget_text import ncu_text

    ncu_dir = Path(__file__).resolve().parents[1] / "data" / "ncu"
    report = parse_csv((ncu_dir / "h100_full_4gemm_details.csv").read_text())
    dev = analyze_chrome_trace(BIG).device(0)
    joined = ncu_join.join(report.kernels, ncu_join.timeline_kernels(dev))
    cats = [NcuCategory(c) for c in ncu_join.summarize(joined, dev.categories())]
    assert any(c.summary.category == "gemm" for c in cats)
    b = from_capture(dev, 3, fl=FlopsContext(200.1e12 * 0.7073, 989.0, 790.0))  # the job's FLOPs per step
    assert b is not None
    nb = with_ncu(b, cats, "ncu1")
    gemm = nb.get(Part.GEMM)
    assert gemm is not None and gemm.ncu and gemm.ncu[0].capture == "ncu1"
    assert "compute SOL" in ncu_text(gemm) and "Nsight Compute (capture ncu1)" in ncu_text(gemm)
    assert sum(p.ms for p in nb.parts) == pytest.approx(b.step_ms)  # the figures change no time
    fs, _ = analyze(BudgetContext(nb, Framework.MEGATRON))
    assert any("compute SOL" in f.observation for f in map(worded_remedies, fs) if f.id.startswith("budget-"))


def test_the_pp_budget_counts_each_millisecond_once() -> None:
    """The demo's PP=2 log (2× H200, m=16): its p2p timers are the pipeline's waiting, the same time as
    the stage idle. Before, both were in the budget (exposed communication 84.8 ms with pipeline
    send/recv, and pipeline wait 80.8 ms) and compute came out at 118 ms, where the run's own imbalance
    finding puts the stages' forward+backward compute at 247–301 ms."""
    fixture = (Path(__file__).resolve().parents[2] / "perfd" / "app" / "demo" / "data"
               / "megatron_h200x2_tp1_pp2.log")
    parsed = parse_file(fixture, job="pp2")
    a = analyze_run(parsed.job_info, parsed.records, gpu_name="NVIDIA H200", job_name="pp2")
    b = a.summary.step_budget
    assert b is not None
    med: dict[str, Any] = dict(a.summary.medians)
    assert sum(p.ms for p in b.parts) == pytest.approx(b.step_ms)
    assert b.ms(Part.COMM_EXPOSED) == pytest.approx(med["comm_exposed_dp_share"] * b.step_ms)
    assert b.ms(Part.PIPELINE) == pytest.approx(med["pp_idle_max"] * b.step_ms)
    imb = next(f for f in a.findings if f.id == "pp-imbalance")
    light = imb.evidence["lighter_compute_ms"]
    # compute and the data wait inside it are the lighter stage's forward+backward compute
    assert b.ms(Part.COMPUTE) + b.ms(Part.DATA) == pytest.approx(light, rel=0.05)


def test_a_finished_logs_report_says_how_to_take_a_capture_next_time() -> None:
    fixture = (Path(__file__).resolve().parents[2] / "perfd" / "app" / "demo" / "data"
               / "megatron_h200x2_tp1_pp2.log")
    parsed = parse_file(fixture, job="pp2")
    for live, how, want in ((False, Divider.NEXT_RUN, "--capture TRACE"),
                            (True, Divider.TIMELINE, "perfd capture --job pp2")):
        a = analyze_run(parsed.job_info, parsed.records, gpu_name="NVIDIA H200", job_name="pp2", live=live)
        r = next(r for r in a.recommendations if r.finding_id == "mfu-grade")
        assert isinstance(r, RunRecommendation) and isinstance(r.facts, NextStepFacts)
        assert r.facts.divider is how and r.facts.job == "pp2"
        action = worded_recommendation(r).action  # as the report says it
        assert want in action, (live, action)
        assert ("next run" in action) is not live


def test_the_grade_is_never_explained_by_causes_the_report_measured_small() -> None:
    from perfd.analytics.run.run_grade import explain_grade
    from perfd.report.grade_text import explanation_text

    def said(*args: float | BudgetClass | None) -> str:
        return explanation_text(explain_grade(*args))  # type: ignore[arg-type]

    memory = BudgetClass(BottleneckClass.MEMORY, {BottleneckClass.MEMORY: 0.6, BottleneckClass.COMPUTE: 0.3},
                         0.3)

    assert explain_grade(0.2, None, None).basis is GradeBasis.BAND
    assert "usually communication or data loading" in said(0.2, None, None)
    ruled = explain_grade(0.2, 0.006, None)
    assert (ruled.basis, ruled.small_data, ruled.small_comm) == (GradeBasis.RULED_OUT, True, False)
    text = said(0.2, 0.006, None)
    assert "not data loading (0.6%)" in text and "usually" not in text and "not timed" in text
    assert "not data loading (1.2%) nor exposed communication (0.2%)" in said(0.2, 0.012, 0.002)
    assert said(0.2, 0.3, 0.2).endswith("(usually communication or data loading)")
    assert explain_grade(0.35, 0.0, 0.0, memory).basis is GradeBasis.BUDGET
    assert said(0.35, 0.0, 0.0, memory) == ("MFU 30–40%: the step budget shows where the time goes — "
                                           "memory-bound (memory 60%, compute 30% of the step)")


@pytest.mark.slow
def test_the_capture_says_what_it_cost_the_steps_it_recorded() -> None:
    """A captured step against the steady one is the profiler's own cost: said beside the budget, a
    warning above th.CAPTURE_SLOWDOWN (the tiny job's capture nearly doubled its step)."""
    from perfd.analytics.advice.budget_findings import BudgetContext, analyze

    dev = analyze_chrome_trace(OPS).device(0)
    for steady, sev in ((700.0, "info"), (400.0, "warning")):
        b = from_capture(dev, 3, timers=TimerShares(steady, 0.01), steps_from="trace")
        assert b is not None and b.capture_overhead_ms == pytest.approx(b.step_ms - steady)
        f = next(worded_remedies(x) for x in analyze(BudgetContext(b))[0] if x.id == "budget-capture-cost")
        assert f.severity == sev and "steps counted from the steps the trace marks" in f.observation

"""analyze_run over the fixture's real numbers, and the edge cases: NaN loss, missing inputs, JSON."""

from __future__ import annotations

import dataclasses
import json
import statistics
from typing import Any

import pytest

from perfd.analytics.run.run_analysis import analyze_run, resolve_dtype
from perfd.analytics.run.run_facts import (
    BubbleFacts,
    ImbalanceFacts,
    RebalanceFacts,
    RunFinding,
    RunRecommendation,
    StragglerFacts,
)
from perfd.analytics.steps.provenance import Code, cite
from perfd.core.model import ParallelLayout, Provenance, StepRecord, TimerValue
from perfd.report import analysis_json
from perfd.report.grade_text import worded, worded_recommendation
from perfd.report.provenance_text import line
from perfd.report.row_json import run_json
from tests.analytics.analytics_helpers import fixture_job, fixture_record, fixture_records, fixture_row
from tests.analytics.megatron_fixture_data import ROWS

ITERATION_KEYS = {
    "iteration", "step_time_ms", "logged_tflops_per_gpu", "model_tflops_per_gpu", "mfu", "data_share",
    "comm_exposed_share", "comm_exposed_dp_share", "comm_exposed_pp_share", "pp_bubble_analytic",
    "pp_idle_min", "pp_idle_max", "pp_imbalance", "steady_state", "source",
}


def test_fixture_run_summary() -> None:
    a = analyze_run(fixture_job(), fixture_records(), gpu_name="NVIDIA H200")
    s, med = a.summary, dict[str, Any](a.summary.medians)
    assert s.n_iterations == 40 and s.n_steady == 36
    assert (s.steady_first_iteration, s.steady_last_iteration) == (5, 40)
    # The steady values are the steady steps' sums, checked here against the log's own numbers: the
    # step time per step (their mean), Megatron's logged TFLOP/s time-weighted (FLOPs summed over time
    # summed), the batch-generator timer summed over the steps summed.
    steady = [r for r in fixture_records() if 5 <= r.iteration <= 40]
    total = sum(r.step_time_ms or 0.0 for r in steady)
    logged = sum((r.logged_tflops_per_gpu or 0.0) * (r.step_time_ms or 0.0) for r in steady) / total
    data = sum(r.timers["batch-generator"].max_ms or 0.0 for r in steady) / total
    assert med["step_time_ms"] == pytest.approx(total / len(steady))  # 344.5 ms (median 336.8)
    assert med["logged_tflops_per_gpu"] == pytest.approx(logged)  # 80.9 (the median of single steps: 82.8)
    assert med["model_tflops_per_gpu"] == pytest.approx(logged, abs=0.05)
    assert med["mfu"] == pytest.approx(med["model_tflops_per_gpu"] / 989)
    assert med["pp_bubble_analytic"] == pytest.approx(1 / 17)
    assert med["pp_idle_max"] == pytest.approx(0.238, abs=0.002)  # lighter stage ~24%
    assert med["pp_idle_min"] == pytest.approx(0.087, abs=0.002)  # heavier stage ~9%
    assert med["pp_imbalance"] == pytest.approx(med["pp_idle_max"] - 1 / 17)
    assert med["data_share"] == pytest.approx(data)
    assert med["comm_exposed_share"] == pytest.approx(0.251, abs=0.002)
    assert med["comm_exposed_dp_share"] == pytest.approx(0.0029, abs=0.0002)
    assert med["comm_exposed_pp_share"] == pytest.approx(0.248, abs=0.002)
    assert s.tflops_check_n == 36 and s.tflops_check_n_disagree == 0
    assert s.bottleneck.cls.value == "pipeline-bound"
    assert list(s.straggler_persistent_ranks) == []
    assert s.straggler_between_stages_fraction == pytest.approx(35 / 36)


def test_every_iteration_matches_logged_throughput() -> None:
    a = analyze_run(fixture_job(), fixture_records(), gpu_name="NVIDIA H200")
    for it in a.iterations:  # warm-up included: the formula holds on every line
        assert it.tflops_check_ok is True, it.iteration
        assert it.model_tflops_per_gpu is not None and it.logged_tflops_per_gpu is not None
        assert abs(it.model_tflops_per_gpu - it.logged_tflops_per_gpu) <= max(
            0.01 * it.logged_tflops_per_gpu, 0.05)
    it38 = next(it for it in a.iterations if it.iteration == 38)
    assert it38.model_tflops_per_gpu == pytest.approx(84.213, abs=1e-3)
    assert it38.mfu == pytest.approx(84.213 / 989, rel=1e-4)
    assert it38.pp_idle_max == pytest.approx(1 - 248.2 / 322.71)
    assert it38.steady_state and it38.straggler_between_stages and it38.straggler_rtt_max_rank == 1
    assert it38.sources["data_share"].code is Code.TIMER_SHARE
    assert it38.sources["data_share"].args[-1] == Provenance("megatron", "h200x2_tp1_pp2_gbs64_mbs4.log:1769")
    assert it38.sources["pp_idle_max"].caveat is Code.MINMAX_PAIRING
    assert it38.sources["data_share"].args[:5] == ("megatron", "batch-generator", "max across ranks", 12.7,
                                                    331.1)
    # and as the report and the JSON legend show it (a golden sentence on recorded data)
    assert line(it38.sources["pp_idle_max"]) == (
        "megatron:1 − (forward-compute min 124.99 + backward-compute min 123.21) / forward-backward max "
        "322.71; megatron:h200x2_tp1_pp2_gbs64_mbs4.log:1769 [inference: min forward paired with min "
        "backward (lighter stage), max with max (heavier stage); minmax timers do not say which rank "
        "holds which value]")


def test_findings_and_recommendations_on_fixture() -> None:
    a = analyze_run(fixture_job(), fixture_records(), gpu_name="NVIDIA H200")
    ids = [f.id for f in a.findings]
    assert {"mfu-grade", "pp-imbalance", "tflops-crosscheck", "comm-pp-wait", "data-loading",
            "straggler-between-stages"} <= set(ids)
    assert "pp-bubble" not in ids  # 1/17 is small: imbalance, not the schedule, is the problem
    imb = next(f for f in a.findings if f.id == "pp-imbalance")
    assert isinstance(imb, RunFinding) and isinstance(imb.facts, ImbalanceFacts)
    assert imb.facts.idle_lighter == pytest.approx(0.238, abs=5e-4)
    assert "iterations 5–40" in worded(imb).iterations
    assert "23.8%" in worded(imb).observation and "5.9%" in worded(imb).observation  # as the report says it
    top = a.recommendations[0]
    assert top.priority == 1 and top.finding_id == "pp-imbalance"
    assert isinstance(top, RunRecommendation) and isinstance(top.facts, RebalanceFacts)
    s = top.facts.slower  # the straggler detector's slower rank: rank 1, the last of two stages
    assert s is not None and (s.rank, s.stage, s.pp) == (1, 1, 2)
    # one 62 ms layer > the 54 ms gap: said, not hidden
    assert top.facts.per_layer_ms is not None and top.facts.best_move == 0
    shown = worded_recommendation(top)
    assert "logits" in shown.action and "--decoder-last-pipeline-num-layers" in shown.action
    assert "rank 1 (stage 1, the last stage)" in shown.detail and "flip the imbalance" in shown.detail
    assert all(r.finding_id in ids for r in a.recommendations)
    assert [r.priority for r in a.recommendations] == list(range(1, len(a.recommendations) + 1))


def test_pp_bubble_recommendation_uses_job_numbers() -> None:
    job = fixture_job()
    job.layout = ParallelLayout(world_size=2, tp=1, pp=2, dp=1, cp=1, micro_batch_size=16,
                                global_batch_size=64)
    recs = [StepRecord(job="j", iteration=i, step_time_ms=260.0, global_batch_size=64, timers={
        "forward-backward": TimerValue(250.0, 250.0), "forward-compute": TimerValue(100.0, 100.0),
        "backward-compute": TimerValue(100.0, 100.0)}) for i in range(1, 21)]
    a = analyze_run(job, recs, gpu_name="NVIDIA H200")
    assert a.summary.median("pp_bubble_analytic") == pytest.approx(0.2)  # m = 4
    rec = next(r for r in a.recommendations if r.finding_id == "pp-bubble")
    assert isinstance(rec, RunRecommendation) and isinstance(rec.facts, BubbleFacts)
    assert (rec.facts.microbatches, rec.facts.need) == (4, 19)
    shown = worded_recommendation(rec)
    assert "from 4 to ≥19" in shown.action and "interleaved" in shown.action
    assert "pp-imbalance" not in [f.id for f in a.findings]


def test_nan_loss_iteration_does_not_break_anything() -> None:
    recs = fixture_records()
    recs[19].lm_loss = None  # iteration 20: Megatron removes the loss field on NaN
    recs[20].lm_loss = float("nan")
    a = analyze_run(fixture_job(), recs, gpu_name="NVIDIA H200")
    it20 = a.iterations[19]
    assert it20.lm_loss is None and it20.sources["lm_loss"].code is Code.NO_LOSS
    assert a.iterations[20].lm_loss is None
    assert it20.mfu is not None and it20.steady_state
    losses = [r[4] for r in ROWS if r[0] >= 5 and r[0] not in (20, 21)]
    assert a.summary.median("lm_loss") == pytest.approx(statistics.median(losses))
    doc = json.loads(json.dumps(run_json(a), allow_nan=False))
    # absent, never null; each row says why by a code the legend spells out once
    for row in doc["iterations"][19:21]:
        assert "lm_loss" not in row
        assert doc["iteration_codes"]["absent"][row["absent"]["lm_loss"]].startswith("absent: no loss")


def test_unknown_gpu_gives_null_mfu_not_zero() -> None:
    a = analyze_run(fixture_job(), fixture_records(), gpu_name=None)
    assert all(it.mfu is None for it in a.iterations)
    assert a.summary.median("mfu") is None
    mfu_src = a.iterations[10].sources["mfu"]
    assert mfu_src.code is Code.PEAK_NO_GPU and a.job.gpu.peak_reason == mfu_src  # the peak's reason, a code
    doc = run_json(a)
    assert all("mfu" not in it for it in doc["iterations"])  # absent from every row, never 0
    assert "GPU name unknown" in doc["iteration_codes"]["sources"]["mfu"]
    assert doc["job"]["gpu"]["peak_tflops"] is None
    assert doc["job"]["gpu"]["peak_reason"].startswith("GPU name unknown; give the GPU")  # worded in the JSON
    assert a.to_json()["job"]["gpu"]["peak_reason"] == "PEAK_NO_GPU"  # the analysis' own: its code
    assert any(f.id == "mfu-absent" for f in a.findings)
    # an explicit peak from config makes MFU available again
    b = analyze_run(fixture_job(), fixture_records(), gpu_name="Some GPU", peak_tflops=500.0)
    assert b.iterations[37].mfu == pytest.approx(84.213 / 500, rel=1e-4)


def test_missing_model_spec_falls_back_to_logged_then_absent() -> None:
    job = fixture_job()
    job.spec = dataclasses.replace(job.spec, hidden_size=None)
    a = analyze_run(job, fixture_records(), gpu_name="NVIDIA H200")
    it = a.iterations[37]
    assert it.model_tflops_per_gpu == 84.2  # Megatron's figure, second preference
    # why perfd's formula is unavailable: the FLOPs count's reason, as a code
    assert it.sources["model_tflops_per_gpu"] == cite(Code.THROUGHPUT_LOGGED, "megatron",
                                                      cite(Code.MISSING, ("hidden_size",)))
    assert it.tflops_check_ok is None  # nothing to cross-check against itself
    assert a.job.flops.per_iteration is None and "hidden_size" in a.job.flops.missing
    recs = fixture_records()
    for r in recs:
        r.logged_tflops_per_gpu = None
    b = analyze_run(job, recs, gpu_name="NVIDIA H200")
    assert b.iterations[37].model_tflops_per_gpu is None and b.iterations[37].mfu is None
    why = b.iterations[37].sources["model_tflops_per_gpu"]
    assert why == cite(Code.MISSING, ("hidden_size",))


def test_missing_timers_leave_metrics_absent() -> None:
    recs = [StepRecord(job="j", iteration=i, step_time_ms=331.1, logged_tflops_per_gpu=84.2,
                       global_batch_size=64) for i in range(1, 11)]
    a = analyze_run(fixture_job(), recs, gpu_name="NVIDIA H200")
    it = a.iterations[-1]
    assert it.mfu is not None
    for key in ("data_share", "comm_exposed_share", "comm_exposed_dp_share", "comm_exposed_pp_share",
                "pp_idle_min", "pp_idle_max", "pp_imbalance"):
        assert getattr(it, key) is None, key
        assert it.sources[key].absent, key
    assert it.pp_bubble_analytic == pytest.approx(1 / 17)  # from the layout alone


def test_world_size_from_layout_product() -> None:
    job = fixture_job()
    job.layout = dataclasses.replace(job.layout, world_size=None)
    a = analyze_run(job, [fixture_record(fixture_row(38))], gpu_name="NVIDIA H200")
    assert a.iterations[0].model_tflops_per_gpu == pytest.approx(84.213, abs=1e-3)
    job.layout = dataclasses.replace(job.layout, cp=None)
    b = analyze_run(job, [fixture_record(fixture_row(38))], gpu_name="NVIDIA H200")
    # cp unknown: the world size is not guessed; Megatron's own figure is used and says why
    assert b.iterations[0].model_tflops_per_gpu == 84.2
    src = b.iterations[0].sources["model_tflops_per_gpu"]
    assert src.code is Code.THROUGHPUT_LOGGED and src.args[1] == cite(Code.MISSING, ("world size",))


def test_to_json_shape() -> None:
    a = analyze_run(fixture_job(), fixture_records(), gpu_name="NVIDIA H200")
    # no rows, no legend, no incidents (their lines), no report: made where shown (perfd.report)
    assert list(a.to_json()) == ["job", "summary"]
    assert list(run_json(a)) == ["job", "iterations", "iteration_codes", "summary", "incidents"]
    doc = analysis_json(a)  # what `perfd analyze megatron --json` prints
    assert list(doc) == ["job", "iterations", "iteration_codes", "summary", "incidents", "report"]
    assert doc["incidents"] == []  # the shared fixture's slow iterations are jitter, not incidents
    assert ITERATION_KEYS <= set(doc["iterations"][0])
    assert any("straggler" in k for k in doc["iterations"][0])
    assert doc["job"]["layout"]["microbatches"] == 16 and doc["job"]["gpu"]["peak_tflops"] == 989.0
    assert doc["job"]["flops_per_iteration"] == 55_765_855_371_264
    assert doc["job"]["flops_formula"] == "megatron-core>=0.12"
    assert set(doc["report"]) == {"summary", "metrics", "step_budget", "arming", "findings",
                                 "recommendations", "plan"}
    assert doc["report"]["plan"] is None  # no capture: no plan (absent, not an empty one)
    json.dumps(doc, allow_nan=False)
    assert doc["iterations"][0]["steady_state"] is False and doc["iterations"][4]["steady_state"] is True


def test_resolve_dtype() -> None:
    job = fixture_job()
    assert resolve_dtype(job, None) == ("bf16", cite(Code.DTYPE_FLAG, "bf16"))
    assert resolve_dtype(job, "fp8") == ("fp8", cite(Code.DTYPE_ARGUMENT))
    job.arguments = {"bf16": "False", "fp16": "True"}
    assert resolve_dtype(job, None) == ("fp16", cite(Code.DTYPE_FLAG, "fp16"))
    job.arguments = {"fp8": "hybrid", "bf16": "True"}
    assert resolve_dtype(job, None) == ("fp8", cite(Code.DTYPE_FLAG, "fp8"))
    job.arguments = {"bf16": "False", "fp16": "False"}
    assert resolve_dtype(job, None) == ("fp32", cite(Code.DTYPE_NO_FLAG))
    job.arguments = {}
    assert resolve_dtype(job, None) == (None, cite(Code.UNKNOWN))


def test_dp2_per_rank_persistent_straggler_end_to_end() -> None:
    job = fixture_job()
    job.layout = ParallelLayout(world_size=2, tp=1, pp=1, dp=2, cp=1, micro_batch_size=4,
                                global_batch_size=64)
    job.timing_log_option = "all"
    recs = []
    for i in range(1, 31):
        slow = 1.4 if i % 4 else 1.0  # rank 1 slow in 3 of every 4 iterations
        recs.append(StepRecord(job="dp2", iteration=i, step_time_ms=400.0, global_batch_size=64, timers={
            "forward-compute": TimerValue(per_rank={0: 100.0, 1: 100.0 * slow}),
            "backward-compute": TimerValue(per_rank={0: 200.0, 1: 200.0 * slow}),
            "all-grads-sync": TimerValue(per_rank={0: 120.0 * slow - 60.0, 1: 60.0}),
        }))
    a = analyze_run(job, recs, gpu_name="NVIDIA H100 80GB HBM3")
    assert list(a.summary.straggler_persistent_ranks) == [1]
    assert a.summary.straggler_flag_fraction[1] == pytest.approx(20 / 27)  # steady: iterations 4–30
    assert a.iterations[5].straggler_candidate_ranks == [1]  # iteration 6
    assert a.iterations[7].straggler_candidate_ranks == []  # iteration 8: even
    assert a.iterations[5].pp_idle_max is None and a.iterations[5].pp_bubble_analytic == 0.0
    # rank 0 waits in the all-reduce for the slow rank: the per-rank sum names it
    assert a.iterations[5].comm_method == "per-rank"
    assert a.iterations[5].comm_exposed_share == pytest.approx((120 * 1.4 - 60) / 400)
    f = next(f for f in a.findings if f.id == "straggler-rank-1")
    assert f.evidence["rank"] == 1
    rec = next(r for r in a.recommendations if r.finding_id == "straggler-rank-1")
    assert isinstance(rec, RunRecommendation) and isinstance(rec.facts, StragglerFacts)
    assert rec.facts.rank == 1 and rec.facts.fraction == pytest.approx(20 / 27)
    assert "rank 1's GPU health" in worded_recommendation(rec).action

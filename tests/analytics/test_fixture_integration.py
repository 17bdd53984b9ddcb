"""End to end on the real log: collectors/megatron parses it, analyze_run reads the records."""

from __future__ import annotations

from pathlib import Path

import pytest

megatron = pytest.importorskip("perfd.collectors.megatron")
if not hasattr(megatron, "parse_file"):  # the parser is being written beside this
    pytest.skip("perfd.collectors.megatron.parse_file not available yet", allow_module_level=True)

from perfd.analytics.run.run_analysis import analyze_run  # noqa: E402
from perfd.analytics.steps.provenance import Code, cite  # noqa: E402
from perfd.core.model import Provenance  # noqa: E402
from perfd.report import build_report, render_text  # noqa: E402

_REPO = Path(__file__).resolve().parents[2]
# The real 2×H200 log as the demo ships it: in every checkout.
FIXTURE = _REPO / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
pytestmark = pytest.mark.skipif(not FIXTURE.exists(), reason=f"fixture missing: {FIXTURE}")


@pytest.fixture(scope="module")
def parsed():
    log = megatron.parse_file(FIXTURE, job="fixture")
    return log, analyze_run(log.job_info, log.records, gpu_name="NVIDIA H200")


def test_layout_and_bubble(parsed) -> None:
    log, a = parsed
    lay = log.job_info.layout
    assert (lay.tp, lay.pp, lay.dp) == (1, 2, 1)
    assert lay.microbatches() == 16 and a.job.layout.microbatches == 16
    assert a.summary.to_json()["medians"]["pp_bubble_analytic"] == pytest.approx(1 / 17)
    assert a.job.framework_version == "0.20.0" and a.job.flops.formula == "megatron-core>=0.12"
    assert a.job.flops.per_iteration == 55_765_855_371_264


def test_tflops_within_1pct_on_every_steady_iteration(parsed) -> None:
    _, a = parsed
    steady = a.steady_iterations()
    assert len(steady) == 36 and [it.iteration for it in steady] == list(range(5, 41))
    for it in steady:
        assert it.model_tflops_per_gpu is not None and it.logged_tflops_per_gpu is not None
        assert it.sources["model_tflops_per_gpu"].code is Code.THROUGHPUT
        assert str(it.sources["model_tflops_per_gpu"].args[1]).startswith("formula:megatron-core>=0.12")
        assert abs(it.model_tflops_per_gpu - it.logged_tflops_per_gpu) / it.logged_tflops_per_gpu < 0.01
        assert it.tflops_check_ok is True


def test_mfu_against_h200_peak(parsed) -> None:
    _, a = parsed
    assert a.job.gpu.peak_tflops == 989.0 and a.job.gpu.dtype == "bf16"
    med = a.summary.to_json()["medians"]
    assert med["mfu"] == pytest.approx(med["model_tflops_per_gpu"] / 989)
    assert med["mfu"] == pytest.approx(0.0818, abs=5e-4)  # 80.9 TFLOP/s sustained over the steady steps
    it38 = next(it for it in a.iterations if it.iteration == 38)
    assert it38.model_tflops_per_gpu == pytest.approx(84.2, rel=0.01)
    assert it38.sources["step_time_ms"] == cite(Code.RECORD, Provenance("megatron", f"{FIXTURE.name}:1769"))


def test_stage_idle_and_imbalance(parsed) -> None:
    _, a = parsed
    med = a.summary.to_json()["medians"]
    assert med["pp_idle_min"] == pytest.approx(0.08, abs=0.01)  # heavier stage ~8%
    assert med["pp_idle_max"] == pytest.approx(0.24, abs=0.01)  # lighter stage ~24%
    assert med["pp_imbalance"] == pytest.approx(med["pp_idle_max"] - 1 / 17)
    assert any(f.id == "pp-imbalance" for f in a.findings)
    assert a.recommendations[0].finding_id == "pp-imbalance"
    assert a.summary.to_json()["bottleneck"] == "pipeline-bound"
    text = render_text(build_report(a))
    assert "Stage imbalance dominates the pipeline bubble" in text


def test_other_shares(parsed) -> None:
    _, a = parsed
    med = a.summary.to_json()["medians"]
    assert med["data_share"] == pytest.approx(0.039, abs=0.002)
    assert med["comm_exposed_share"] == pytest.approx(0.252, abs=0.003)
    assert med["comm_exposed_dp_share"] < 0.01 < med["comm_exposed_pp_share"]
    assert a.summary.to_json()["straggler_persistent_ranks"] == []


REAL_LOGS = _REPO / "tests" / "data" / "megatron"
LAYOUTS = ["tp2_mha_gelu", "tp2_swiglu_gqa_untied", "pp2_vpp2_interleaved", "dp2_all_timers",
           "dp2_ep2_moe_top2"]


@pytest.fixture(scope="module", params=LAYOUTS)
def real_log(request):
    path = REAL_LOGS / f"{request.param}.log"
    if not path.exists():
        pytest.skip(f"missing {path}")
    log = megatron.parse_file(path, job=request.param)
    return request.param, log, analyze_run(log.job_info, log.records, gpu_name="NVIDIA H200")


def test_real_logs_tflops_match_on_every_steady_iteration(real_log) -> None:
    name, _, a = real_log
    steady = a.steady_iterations()
    assert len(steady) >= 10, name
    for it in steady:
        assert it.sources["model_tflops_per_gpu"].code is Code.THROUGHPUT, name
        assert str(it.sources["model_tflops_per_gpu"].args[1]).startswith("formula:megatron-core>=0.12"), name
        assert it.model_tflops_per_gpu is not None and it.logged_tflops_per_gpu is not None
        assert abs(it.model_tflops_per_gpu / it.logged_tflops_per_gpu - 1) < 0.01, (name, it.iteration)
    assert a.summary.to_json()["tflops_check_n_disagree"] == 0


def test_real_logs_layout_specific_metrics(real_log) -> None:
    name, log, a = real_log
    med, src = a.summary.to_json()["medians"], a.job.to_json()["flops_source"] or ""
    ids = {f.id for f in a.findings}
    if name == "tp2_swiglu_gqa_untied":
        assert "GQA" in src and "E=3" in src and log.job_info.spec.untie_embeddings
    if name == "dp2_ep2_moe_top2":
        assert "MoE 8 layers top-2" in src
    if name == "pp2_vpp2_interleaved":
        assert med["pp_bubble_analytic"] == pytest.approx(1 / 33)  # (p-1)/(v·m+p-1), v=2, m=16
        assert med["pp_idle_max"] > 0.15 and "pp-imbalance" in ids
        assert a.summary.to_json()["bottleneck"] == "pipeline-bound"
    if name == "dp2_all_timers":
        it = a.steady_iterations()[-1]
        assert it.comm_method == "per-rank" and it.pp_idle_max is None
        assert it.straggler_compute_spread_flagged is None  # per-rank rows name ranks instead
        assert "straggler-spread" not in ids
        assert list(a.summary.straggler_persistent_ranks) == []  # rank 0 flagged in 13/27: < 50%
        assert a.summary.to_json()["straggler_flag_fraction"]["0"] == pytest.approx(13 / 27)
    if name.startswith("tp2"):
        assert med["pp_bubble_analytic"] == 0.0 and med["pp_idle_max"] is None
        assert med["comm_exposed_dp_share"] is not None and med["comm_exposed_pp_share"] is None

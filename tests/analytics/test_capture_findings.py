"""Kernel categories and capture findings, on recorded real captures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfd.analytics.advice.budget_findings import RemedyRecommendation
from perfd.analytics.advice.capture_findings import SlowerFinding, diagnose_capture
from perfd.analytics.advice.remedies import Framework
from perfd.analytics.advice.remedy_said import Say
from perfd.analytics.breakdown import kernels as kc
from perfd.analytics.breakdown.device_breakdown import devices_of
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.finding_types import Recommendation
from perfd.capture.analysis import analyze_intervals
from perfd.capture.timeline_events import KernelEvent, MemEvent
from perfd.report.budget_text import worded_budget
from perfd.report.capture_text import class_reason
from perfd.report.grade_text import worded
from perfd.report.remedy_text import worded_remedy


def _action(r: Recommendation) -> Say | None:
    """A remedy recommendation's action as its code (its words are the report's)."""
    return r.facts.advice[0].action.code if isinstance(r, RemedyRecommendation) and r.facts else None

DATA = Path(__file__).resolve().parents[1] / "data" / "captures"
PP2 = json.loads((DATA / "megatron_pp2_nsys_h200x2.analysis.json").read_text())


@pytest.mark.parametrize(("name", "cat"), [
    # names as they appear in the recorded H200 captures (Megatron-LM local transformer, torch 2.11)
    ("ncclDevKernel_SendRecv", "nccl:sendrecv"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "nccl:allreduce"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "nccl:reducescatter"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", kc.GEMM),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma", kc.GEMM),
    ("softmax_warp_forward", kc.ATTENTION),
    ("flash_fwd_kernel", kc.ATTENTION),
    ("vectorized_elementwise_kernel", kc.ELEMENTWISE),
    ("fused_dropout_kernel_vec", kc.ELEMENTWISE),
    ("CatArrayBatchedCopy", kc.ELEMENTWISE),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16>", kc.NORMALIZATION),
    ("void at::native::reduce_kernel<512, 1>", kc.REDUCTION),
    ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor>", kc.OPTIMIZER),
    ("some_custom_kernel", kc.OTHER),
])
def test_kernel_categories(name: str, cat: str) -> None:
    assert kc.category(name) == cat


def test_pp2_sendrecv_is_pipeline_waiting() -> None:
    """The real Megatron PP=2 nsys capture (2×H200, recorded before the exclusive attribution: its
    parts are rebuilt from the top kernels' shares, and the budget says so): stage 0's SendRecv time
    is a budget part of its own — the wait for the peer stage — with the pipeline's Megatron remedy;
    the stage without p2p has no such part."""
    d = diagnose_capture(devices_of(PP2["devices"]), label="pp2.nsys-rep", framework=Framework.MEGATRON)
    ids = {f.id for f in d.findings}
    assert "budget-pipeline-0" in ids and "budget-pipeline-1" not in ids
    f0 = next(f for f in d.findings if f.id == "budget-pipeline-0")
    assert f0.evidence["ms"] == pytest.approx(319.28, abs=0.01)
    assert "not link bandwidth" in worded_budget(f0).observation  # as the report words it
    rec = next(r for r in d.recommendations if r.finding_id == f0.id)
    assert _action(rec) is Say.PIPELINE_MEGATRON
    assert "--num-layers-per-virtual-pipeline-stage" in worded_remedy(rec).action  # as the report words it
    assert d.budgets[0].attribution.startswith("category shares of the top 10 kernels only")
    assert "idle not split" in d.budgets[0].attribution


def test_pp2_unfused_pointwise_kernels_and_softmax() -> None:
    d = diagnose_capture(devices_of(PP2["devices"]), label="pp2.nsys-rep", framework=Framework.MEGATRON)
    f1 = next(f for f in d.findings if f.id == "budget-pointwise-1")
    assert f1.evidence["share"] > 0.05
    assert d.budgets[1].ms(Part.ATTENTION) == pytest.approx(47.5, abs=0.1)  # softmax among its top kernels
    rec = next(r for r in d.recommendations if r.finding_id == f1.id)
    assert _action(rec) in (Say.TE_LAYERS, Say.TE_LAYERS_INSTALL)
    assert "MFU" not in worded_remedy(rec).detail  # MFU unknown here: ms only
    assert d.bottleneck == "sync-bound"  # the window is mostly idle (an nsys window of the whole run)
    assert class_reason(d.basis).endswith("(pp2.nsys-rep, device 1)")


def _k(dev: int, t0: float, dur_us: float, name: str) -> KernelEvent:
    return KernelEvent(dev, t0, t0 + dur_us * 1e3, name)


def test_launch_bound_from_tiny_kernels_with_gaps() -> None:
    ks = [_k(0, i * 20e3, 4.0, "vectorized_elementwise_kernel") for i in range(500)]  # 4 µs every 20 µs
    a = analyze_intervals(ks, [MemEvent(0, 0.0, 1e3)])
    dev = a.devices[0]
    assert dev.kernel_median_us == pytest.approx(4.0) and dev.categories()["elementwise"] > 0.9
    d = diagnose_capture([dev])
    assert d.bottleneck == "launch-overhead"
    assert any(_action(r) is Say.GRAPHS_COMPILE for r in d.recommendations)


def test_slower_than_steady_and_compute_bound() -> None:
    ks = [_k(0, i * 1e6, 990.0, "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT") for i in range(300)]
    dev = analyze_intervals(ks).devices[0]
    d = diagnose_capture([dev], iterations=3, steady_compute_ms=40.0)
    slow = next(f for f in d.findings if f.id == "capture-slower-than-steady-0")
    assert slow.evidence["ratio"] == pytest.approx(297.0 / 3 / 40.0, rel=1e-3)
    assert isinstance(slow, SlowerFinding) and slow.facts is not None and slow.title == ""  # a kind, numbers
    assert (slow.facts.device, slow.facts.steady_ms) == (0, 40.0)
    shown = worded(slow)  # golden: as the capture's record serves it
    assert shown.title == "Device 0: kernels ran 2.5× slower than in steady state"
    assert shown.observation == ("Compute kernels took 99 ms per captured iteration against 40 ms of "
                                 "forward+backward compute per steady iteration (timers): the same work ran "
                                 "slower while captured — the GPU was shared, throttled, or clocked down.")
    assert d.bottleneck == "compute-bound"
    usual = diagnose_capture([dev], iterations=3, steady_compute_ms=200.0)  # 99 ms per iteration < 200
    assert not any("slower" in f.id for f in usual.findings)


def test_no_devices_no_class() -> None:
    d = diagnose_capture([])
    assert d.bottleneck == "unknown" and not d.findings
    assert class_reason(d.basis) == "no device in the capture"

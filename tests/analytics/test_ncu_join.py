"""ncu rows joined by name to a capture's kernels, on recorded names: the ncu exports of
tests/data/ncu, the Kineto trace of a real Megatron-LM job on the H100 and the nsys analysis of a real
PP=2 job (tests/data/captures). The tools spell one kernel three ways; the join must find it, and
must not pair two instantiations of one function."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

from perfd.analytics.breakdown import kernels as kc
from perfd.analytics.breakdown.device_breakdown import DeviceBreakdown, devices_of
from perfd.analytics.breakdown.ncu_kernels import KernelBound, MatchKind, NcuKernel
from perfd.analytics.ncu.join import (
    NO_NCCL_FILTER,
    TimelineKernel,
    function_name,
    join,
    kernel_filter,
    match_kernel,
    summarize,
    template_tokens,
    timeline_kernels,
)
from perfd.capture.ncu_report import parse_csv
from tests.trace_cache import analyze_chrome_trace

ROOT = Path(__file__).resolve().parents[1] / "data"
MLP = parse_csv((ROOT / "ncu" / "h100_mlp_sol_details_5.csv").read_text())
PP2 = json.loads((ROOT / "captures" / "megatron_pp2_nsys_h200x2.analysis.json").read_text())


@cache
def kineto_device() -> DeviceBreakdown:
    """The big H100 Megatron-LM Kineto capture, its 80 top kernels (the capture keeps 10)."""
    a = analyze_chrome_trace(ROOT / "captures" / "kineto_h100_megatron" / "big_rank0.json.gz", top_n=80)
    return a.devices[0]


def ncu_kernel(fn: str, marker: str = "") -> NcuKernel:
    return next(k for k in MLP.kernels if function_name(k.name) == fn and marker in k.name)


@pytest.mark.parametrize(("ncu_name", "kineto_name"), [
    # the recorded spellings of the same kernels: ncu (EDG, template parameter names) and Kineto (GNU)
    ("void at::<unnamed>::vectorized_layer_norm_kernel<c10::BFloat16, float, 0>(int, T2, const T1 *, const "
     "T1 *, const T1 *, T2 *, T2 *, T1 *)",
     "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>("
     "int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, "
     "c10::BFloat16*)"),
    ("void at::vectorized_elementwise_kernel<8, at::GeluCUDAKernelImpl(at::TensorIteratorBase &, "
     "at::GeluType)::[lambda() (instance 2)]::operator ()() const::[lambda() (instance 4)]::operator ()() "
     "const::[lambda(c10::BFloat16) (instance 1)], std::array<char *, 2>>(int, T2, T3)",
     "void at::native::vectorized_elementwise_kernel<8, at::native::GeluCUDAKernelImpl(at::"
     "TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()"
     "() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, at::native::GeluCUDAKernelImpl("
     "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::"
     "operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)"),
    ("nvjet_sm90_tst_192x192_64x4_1x2_h_bz_coopB_bias_TNN",
     "nvjet_sm90_tst_192x192_64x4_1x2_h_bz_coopB_bias_TNN"),
])
def test_the_three_spellings_reduce_to_one_function(ncu_name, kineto_name):
    assert function_name(ncu_name) == function_name(kineto_name)
    a, b = template_tokens(ncu_name), template_tokens(kineto_name)
    assert a == b or len(a & b) / len(a | b) >= 0.5


def test_function_name_of_nsys_short_names_and_odd_names():
    for short in ("vectorized_elementwise_kernel", "ncclDevKernel_SendRecv", "softmax_warp_forward"):
        assert function_name(short) == short
    assert function_name("void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, float, 10>"
                         "(c10::BFloat16*, int)") == "softmax_warp_forward"
    assert function_name("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_64x64_32x6_tn_align8>"
                         "(cutlass_80_tensorop_bf16_s16816gemm_64x64_32x6_tn_align8::Params)") == "Kernel2"
    assert function_name("bool operator><int>(a, b)") != ""  # a stray '>' does not break it


@pytest.mark.slow
def test_ncu_rows_find_their_kineto_kernels():
    """Against the real Megatron-LM capture's 80 top kernels: each elementwise instantiation finds its
    own (the GELU among GELU backward and 17 others; the bf16 add among the fp32 and int adds)."""
    timeline = timeline_kernels(kineto_device())
    how, t, n = match_kernel(ncu_kernel("vectorized_elementwise_kernel", "Gelu").name, timeline)
    assert how is MatchKind.TEMPLATE and t is not None and n > 10
    assert "GeluCUDAKernelImpl" in t.name and "Backward" not in t.name
    how, t, _ = match_kernel(ncu_kernel("vectorized_elementwise_kernel", "add").name, timeline)
    assert how is MatchKind.TEMPLATE and t is not None
    assert "CUDAFunctor_add<c10::BFloat16>" in t.name
    how, t, n = match_kernel(ncu_kernel("vectorized_layer_norm_kernel").name, timeline)
    assert how is MatchKind.TEMPLATE and n == 1 and t is not None
    # the MLP loop's GEMM configurations are not Megatron's: no pairing with another nvjet kernel
    how, t, _ = match_kernel(ncu_kernel("nvjet_sm90_tst_192x192_64x4_1x2_h_bz_coopB_bias_TNN").name, timeline)
    assert how is MatchKind.NONE and t is None


@pytest.mark.slow
def test_another_instantiation_is_no_match():
    """The capture keeps its top 10: the GELU is not among them, a multiply with the same function is.
    Pairing them would hand the GELU the multiply's share."""
    top10 = timeline_kernels(kineto_device())[:10]
    mul = [t for t in top10 if function_name(t.name) == "vectorized_elementwise_kernel"]
    assert len(mul) == 1 and "MulFunctor" in mul[0].name
    how, t, n = match_kernel(ncu_kernel("vectorized_elementwise_kernel", "Gelu").name, top10)
    assert how is MatchKind.NONE and t is None and n == 1


def test_ties_are_ambiguous_and_exact_names_win():
    gelu = ncu_kernel("vectorized_elementwise_kernel", "Gelu")
    twins = [TimelineKernel(re.sub(r"<8,", f"<{v},", gelu.name), 1.0, 0.1) for v in (4, 8)]
    how, t, n = match_kernel(gelu.name, twins)  # the vector width is a number: the same tokens
    assert how is MatchKind.EXACT  # ... but one of them is the very name
    how, t, n = match_kernel(gelu.name, [TimelineKernel(twins[0].name, 1, 0.1),
                                         TimelineKernel(twins[0].name.replace("<4,", "<2,"), 1, 0.1)])
    assert how is MatchKind.AMBIGUOUS and t is None and n == 2


def test_nsys_short_names_join_by_function():
    """nsys lists bare functions: the ncu GELU takes the share of every vectorized_elementwise_kernel."""
    timeline = timeline_kernels(devices_of(PP2["devices"])[1])
    gelu = ncu_kernel("vectorized_elementwise_kernel", "Gelu")
    how, t, _ = match_kernel(gelu.name, timeline)
    assert how is MatchKind.FUNCTION and t is not None and t.name == "vectorized_elementwise_kernel"


@pytest.mark.slow
def test_join_carries_category_and_share_and_orders_by_cost():
    dev = kineto_device()
    joined = join(MLP.kernels, timeline_kernels(dev))
    by = {function_name(j.kernel.name) + ("/add" if "add" in j.kernel.name else ""): j for j in joined}
    gelu, add = by["vectorized_elementwise_kernel"], by["vectorized_elementwise_kernel/add"]
    assert gelu.captured_share == pytest.approx(0.0107, abs=5e-4) and gelu.match is MatchKind.TEMPLATE
    assert add.captured_ms is not None and add.captured_ms > 0
    # the category is that of the timeline's name when there is one
    assert gelu.category == kc.category(str(gelu.timeline_name))
    assert by["vectorized_layer_norm_kernel"].category == kc.NORMALIZATION
    assert by["nvjet_sm90_tst_192x192_64x4_1x2_h_bz_coopB_bias_TNN"].category == kc.GEMM
    assert by["nvjet_sm90_tst_192x192_64x4_1x2_h_bz_coopB_bias_TNN"].captured_share is None
    shares = [j.captured_share or 0.0 for j in joined]
    assert shares == sorted(shares, reverse=True)
    assert json.dumps(gelu.to_json())  # plain JSON


@pytest.mark.slow
def test_category_summaries_weigh_by_profiled_time():
    dev = kineto_device()
    joined = join(MLP.kernels, timeline_kernels(dev))
    cats = dev.categories()
    sums = {c.category: c for c in summarize(joined, cats)}
    gemm = sums[kc.GEMM]
    g = [j.kernel for j in joined if j.category == kc.GEMM]
    assert gemm.kernels == 2 and gemm.profiled_ms == pytest.approx(sum(k.profiled_ms or 0 for k in g))
    w = [k.profiled_ms or 0.0 for k in g]
    assert gemm.compute_throughput == pytest.approx(
        sum((k.compute_throughput or 0) * x for k, x in zip(g, w, strict=True)) / sum(w))
    assert gemm.bound is KernelBound.COMPUTE and gemm.captured_share == pytest.approx(cats[kc.GEMM])
    assert gemm.covered_share is None  # neither GEMM configuration is one of Megatron's
    assert gemm.tensor_pipe is None and gemm.top_stall is None  # the details page has neither
    gelu_cat = next(j.category for j in joined if "Gelu" in j.kernel.name)
    ew = [sums[gelu_cat]]
    assert ew and ew[0].covered_share is not None and ew[0].covered_share > 0
    assert json.dumps([c.to_json() for c in sums.values()])


@pytest.mark.slow
def test_kernel_filter_names_the_top_functions_never_nccl():
    flt = kernel_filter(timeline_kernels(devices_of(PP2["devices"])[0]))
    assert flt is not None and flt.startswith("regex:^(") and flt.endswith(")$")
    names = flt[len("regex:^("):-2].split("|")
    assert "ncclDevKernel_SendRecv" not in names and "vectorized_elementwise_kernel" in names
    assert len(names) == len(set(names)) and not any(c.isspace() for c in flt)
    flt = kernel_filter(timeline_kernels(kineto_device()), limit=3)
    assert flt == ("regex:^(nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT|nvjet_sm90_tst_256x128_64x4_1x2_"
                   "h_bz_coopA_NNT|nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT)$")
    assert kernel_filter(["ncclDevKernel_AllReduce_Sum_f32_RING_LL"]) is None


@pytest.mark.parametrize(("name", "profiled"), [
    ("vectorized_elementwise_kernel", True), ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", True),
    ("k", True), ("nb", True), ("ncl_fused", True), ("nccx", True),
    ("ncclDevKernel_SendRecv", False), ("ncclKernel_AllReduce_RING_LL_Sum_float", False), ("nccl", False),
    ("ncc", False), ("n", False),  # left out too: names of 1-3 letters beginning like "nccl" (none seen)
])
def test_the_default_filter_leaves_nccl_out(name, profiled):
    """ncu's regex dialect is not documented; the filter uses classes and alternation only, which every
    dialect reads alike (Python's here)."""
    rx = NO_NCCL_FILTER[len("regex:"):]
    assert bool(re.search(rx, name)) is profiled

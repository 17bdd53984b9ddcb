"""ncu rows by the op that launched them, on the real H100 range of Megatron-LM
(tests/data/ncu/h100_megatron_rank0_*.csv: 40 launches from the step's start, 4 layers, h=1024, local
transformer). Each launch's op is given here as Megatron-LM's local layer launches them (IDs 6-16 one
layer: QKV GEMM, Q·Kᵀ, mask, softmax, dropout, ·V, the context copy, projection GEMM, fc1 GEMM, GELU,
fc2 GEMM), the input perfd's launch matching computes from a timeline of the run (tests/analytics/
test_ncu_launches.py checks that matching on real traces; no trace of this run was recorded).

What the split changes, on the real figures: the nvjet 256x128 kernel on grid (2, 66, 1) reads compute
SOL 55% by name; its linear launches alone run at 72% with the tensor pipe at 81%, its Q·Kᵀ launches at
16% with the tensor pipe at 17%, memory-bound. So "gemm: shape, far below the compute ceiling" was
attention's batched matmuls weighed as linear GEMMs; the budget's "linear layers at 98% of the measured
matmul ceiling" and ncu's verdict now agree. And "pointwise: issue bound" was attention's masked fill."""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path

import pytest

from perfd.analytics.breakdown import kernels as kc
from perfd.analytics.breakdown.budget import BudgetPart, PartDetail, Source, StepBudget
from perfd.analytics.breakdown.job_budget import with_ncu
from perfd.analytics.breakdown.kernel_rows import Reading, RowVerdict, kernel_rows
from perfd.analytics.breakdown.ncu_kernels import KernelBound, effective_bound
from perfd.analytics.breakdown.ncu_rows import CategorySummary, JoinedKernel, NcuCategory, Phase
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.ncu.join import join, summarize
from perfd.analytics.ncu.launches import OpGroup, join_launches
from perfd.analytics.ncu.ncu_verdicts import part_verdicts
from perfd.capture.ncu_report import NcuReport, parse_exports
from perfd.report import ncu_view

NCU = Path(__file__).resolve().parents[2] / "tests" / "data" / "ncu"
TNT = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"
LAYER = ("linear", "attention", "attention", "attention", "attention", "attention", "attention", "linear",
         "linear", "activation", "linear")  # IDs 6-16, 17-27, 28-38 (39: the next layer's QKV GEMM)
OPS = {**{i: "optimizer" for i in (0, 1, 2)}, **{i: "embedding" for i in (3, 4, 5)}, 39: "linear",
       **{base + k: part for base in (6, 17, 28) for k, part in enumerate(LAYER)}}


@cache
def report() -> NcuReport:
    return parse_exports([(NCU / "h100_megatron_rank0_details.csv").read_text(),
                          (NCU / "h100_megatron_rank0_raw.csv").read_text()])


def by_op() -> list[JoinedKernel]:
    groups = [(OpGroup(str(part), Phase.FORWARD), k) for part, k in report().regroup(lambda i: OPS[i])]
    return join_launches(groups, [], None)


def summary(rows: list[CategorySummary], part: str | None, category: str) -> CategorySummary:
    return next(c for c in rows if c.part == part and c.category == category)


def test_one_kernel_by_name_two_ops_by_launch():
    rows = [j for j in by_op() if j.kernel.name == TNT and j.kernel.grid == "(2, 66, 1)"]
    linear, attention = (next(j.kernel for j in rows if j.part == p) for p in ("linear", "attention"))
    assert (linear.invocations, attention.invocations) == (7, 3)
    whole = next(k for k in report().kernels if k.name == TNT and k.grid == "(2, 66, 1)")
    assert whole.compute_throughput == pytest.approx(0.554, abs=0.001)  # by name: the two mixed
    assert (linear.compute_throughput or 0) > 0.7 and (linear.tensor_pipe or 0) > 0.8
    assert linear.bound is KernelBound.COMPUTE
    assert (attention.compute_throughput or 1) < 0.2 and (attention.tensor_pipe or 1) < 0.2
    assert attention.bound is KernelBound.MEMORY


def _budget(of_ceiling: float | None) -> StepBudget:
    detail = PartDetail(achieved_tflops=775.0, of_ceiling=of_ceiling) if of_ceiling else PartDetail()
    parts = (BudgetPart(Part.ATTENTION, 40.0, 0.4, Source.CAPTURE),
             BudgetPart(Part.LINEAR, 30.0, 0.3, Source.CAPTURE, detail),
             BudgetPart(Part.ACTIVATION, 5.0, 0.05, Source.CAPTURE),
             BudgetPart(Part.EMBEDDING, 5.0, 0.05, Source.CAPTURE),
             BudgetPart(Part.POINTWISE, 10.0, 0.1, Source.CAPTURE),
             BudgetPart(Part.OPTIMIZER, 10.0, 0.1, Source.CAPTURE))
    return StepBudget(100.0, parts, (Source.CAPTURE,), iterations=3.0, basis="capture k1")


def _verdicts(joined: list[JoinedKernel], of_ceiling: float | None) -> dict[tuple[str, str], RowVerdict]:
    cats = [NcuCategory(c) for c in summarize(joined)]
    b = with_ncu(_budget(of_ceiling), cats, "n1", joined)
    return {(v.part, v.category): v.verdict for v in part_verdicts(b)}


def test_by_name_the_gemm_verdict_contradicted_the_budget_by_op_it_does_not():
    by_name = summarize(join(report().kernels))
    assert summary(by_name, None, kc.GEMM).compute_throughput == pytest.approx(0.499, abs=0.001)
    # what perfd said before: "shape", far below the compute ceiling, beside the budget's 98%
    assert _verdicts(join(report().kernels), None)[("linear", kc.GEMM)] is RowVerdict.SHAPE
    joined = by_op()
    rows = summarize(joined)
    assert (summary(rows, "linear", kc.GEMM).compute_throughput or 0) > 0.7  # the linear GEMMs alone
    assert (summary(rows, "attention", kc.GEMM).tensor_pipe or 1) < 0.2  # attention's batched matmuls
    got = _verdicts(joined, 0.98)
    assert got[("linear", kc.GEMM)] is RowVerdict.FEWER_FLOPS  # as the budget: at the ceiling
    assert ("attention", kc.GEMM) not in got  # attention's remedy is the budget's fused attention
    assert RowVerdict.SHAPE not in got.values()
    # the trace's measured rate decides the GEMM verdict whatever ncu's replay reads: even by name
    assert _verdicts(join(report().kernels), 0.98)[("linear", kc.GEMM)] is RowVerdict.FEWER_FLOPS
    assert _verdicts(joined, 0.35)[("linear", kc.GEMM)] is RowVerdict.SHAPE  # inefficient: both agree


def test_pointwise_issue_bound_is_not_attentions_masked_fill():
    by_name = _verdicts(join(report().kernels), None)
    assert by_name[("pointwise", kc.ELEMENTWISE)] is RowVerdict.ISSUE_BOUND  # weighed by masked_fill
    got = _verdicts(by_op(), 0.98)
    assert ("pointwise", kc.ELEMENTWISE) not in got  # no pointwise launch of the pointwise part in range
    assert got[("attention", kc.ELEMENTWISE)] is RowVerdict.ISSUE_BOUND  # the mask fill is attention's


def test_a_kernel_whose_registers_cap_its_occupancy_is_latency_bound():
    """The softmax of the issue's run: "compute-bound" by NVIDIA's rule, occupancy register-capped at
    37.5%. Here its recorded figures with that cap (on this smaller run it was capped at 62.5%)."""
    softmax = next(k for k in report().kernels if "softmax_warp_forward" in k.name)
    assert softmax.bound is KernelBound.COMPUTE and softmax.occupancy_limiter == "registers"
    assert effective_bound(softmax, kc.ATTENTION) is KernelBound.COMPUTE  # 62.5%: above the cap
    capped = dataclasses.replace(softmax, theoretical_occupancy=0.375)
    assert effective_bound(capped, kc.ATTENTION) is KernelBound.LATENCY
    row = JoinedKernel(capped, kc.ATTENTION, join([capped])[0].match, part="attention", phase="forward",
                       layers=(1, 2, 3))
    (r,) = kernel_rows([row], 40.0)
    assert r.bound is KernelBound.COMPUTE and r.reading is Reading.OCCUPANCY  # ncu's class, and perfd's
    text = ncu_view.bound_text(r)
    assert "latency-bound: its occupancy is capped at 37.5% by its registers" in text
    cat = summarize([row])[0]
    assert cat.bound is KernelBound.LATENCY and cat.part == "attention"


def test_on_the_timers_budget_attentions_gemms_keep_no_gemm_verdict():
    """With no timeline the rows sit on the timers' undivided compute part; by name the GEMM summary
    said "shape" there, by op attention's batched matmuls are still attention's and the linear GEMMs'
    figures alone (compute SOL 71%) call for neither verdict."""
    compute = StepBudget(100.0, (BudgetPart(Part.COMPUTE, 90.0, 0.9, Source.TIMERS),),
                         (Source.TIMERS,), basis="steady-state timers")

    def verdicts(joined: list[JoinedKernel]) -> dict[tuple[str, str | None, str], RowVerdict]:
        cats = [NcuCategory(c) for c in summarize(joined)]
        b = with_ncu(compute, cats, "n1", joined)
        return {(v.part, v.of, v.category): v.verdict for v in part_verdicts(b)}

    assert verdicts(join(report().kernels))[("compute", None, kc.GEMM)] is RowVerdict.SHAPE
    got = verdicts(by_op())
    assert not any(cat == kc.GEMM for _, _, cat in got)
    assert got[("compute", "attention", kc.ELEMENTWISE)] is RowVerdict.ISSUE_BOUND

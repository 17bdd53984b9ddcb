"""A step budget's JSON read back as it was written, and a malformed one read as absent, never a crash
(a capture's analysis and a kept budget come from an agent or a state store)."""

from __future__ import annotations

import json

import pytest

from perfd.analytics.breakdown.budget import (
    BudgetPart,
    FlopsContext,
    PartDetail,
    Source,
    StepBudget,
    TimerShares,
    attention_detail,
    from_timers,
    math_detail,
)
from perfd.analytics.breakdown.capture_budget import from_capture
from perfd.analytics.breakdown.device_breakdown import DeviceBreakdown
from perfd.analytics.breakdown.step_parts import Part

FL = FlopsContext(flops_per_gpu_step=4e15, peak_tflops=989.0, ceiling_tflops=700.0,
                  attention_flops_per_gpu_step=1e15)


def test_math_and_attention_details_keep_their_keys_and_order_through_json() -> None:
    math, att = math_detail(Part.LINEAR, 900.0, FL), attention_detail(400.0, FL, fused=False)
    assert list(math) == ["flops", "achieved_tflops", "of_ceiling", "at_ceiling_ms", "flops_basis"]
    assert list(att) == ["fused", "flops", "executed_flops", "at_ceiling_ms", "achieved_tflops"]
    b = StepBudget(1300.0, (BudgetPart(Part.LINEAR, 900.0, 0.7, Source.CAPTURE, math),
                            BudgetPart(Part.ATTENTION, 400.0, 0.3, Source.CAPTURE, att)), (Source.CAPTURE,))
    text = json.dumps(b.to_json())
    back = StepBudget.from_json(json.loads(text))
    assert back is not None and json.dumps(back.to_json()) == text


def test_timers_budget_with_overlapping_timers_reads_back_the_same() -> None:
    b = from_timers(TimerShares(step_ms=100.0, data=0.6, comm_exposed=0.5, optimizer_ms=20.0), FL)
    assert b is not None
    opt = b.get(Part.OPTIMIZER)
    assert opt is not None and list(opt.detail) == ["timer_ms", "scaled_from_ms"]
    text = json.dumps(b.to_json())
    back = StepBudget.from_json(json.loads(text))
    assert back is not None and json.dumps(back.to_json()) == text


def test_a_detail_of_another_shape_reads_as_none() -> None:
    d = {"step_ms": 10.0, "parts": [{"part": "linear", "ms": 10.0, "share": 1.0, "source": "capture",
                                     "detail": {"flops": "many", "ncu_kernels": []}}]}
    b = StepBudget.from_json(d)
    assert b is not None and b.parts[0].detail == PartDetail() and b.parts[0].ncu_kernels == ()


@pytest.mark.parametrize("d", [{"step_ms": 1.0, "idle": 5}, {"step_ms": 1.0, "parts": 3},
                               {"step_ms": True}, {"step_ms": 1.0, "window": {"marked": "2", "complete": 1}}])
def test_a_malformed_budget_is_read_as_absent_or_without_the_malformed_field(d: dict[str, object]) -> None:
    b = StepBudget.from_json(d)  # before: TypeError on a non-list ``idle``
    assert b is None or (b.idle == () and b.window is None)


@pytest.mark.parametrize("device", [
    {"parts_ms": {"linear": 5.0}, "idle": [{"cause": "sync", "phase": "optimizer", "ms": "z"}]},
    {"busy_ms": 10.0, "categories": {"gemm": "x"}},
    {"parts_ms": {"linear": 5.0}, "part_kernels": {"linear": [{"name": "k", "total_ms": "x"}]}},
    {"parts_ms": {"linear": 5.0, "idle_long": 1.0}, "complete": {"steps": 1, "parts_ms": {"linear": "y"}}},
])
def test_a_capture_with_a_figure_that_is_not_a_number_reads_it_as_absent(device: dict[str, object]) -> None:
    read = DeviceBreakdown.from_json({"device": 0, **device})  # a capture's event, as it arrives
    assert read is not None
    from_capture(read, 2.0)  # before: ValueError from float() of a string


def test_a_capture_figure_that_is_not_a_number_is_left_out_of_the_part() -> None:
    read = DeviceBreakdown.from_json({"device": 0, "parts_ms": {"linear": 5.0}, "part_kernels": {"linear": [
        {"name": "k", "total_ms": "x", "count": 2}, {"name": "j", "total_ms": 4.0, "count": 2}]}})
    assert read is not None
    b = from_capture(read, 2.0)
    assert b is not None
    lin = b.get(Part.LINEAR)
    assert lin is not None and lin.detail["kernels"] == [{"name": "k", "ms": 0.0, "count": 1.0},
                                                         {"name": "j", "ms": 2.0, "count": 1.0}]

"""A step whose torch.optim annotation wraps a closure (``optimizer.step(closure)``: a plain loop passing
one, Lightning's automatic optimisation, LBFGS) holds the step's forward and backward: only the work
after the closure's backward is the optimizer phase (perfd.capture.ops, perfd.capture.step_marks), and
the optimizer the trace names is read off it (perfd.analytics.breakdown.optimizer_seen). A hand-built
trace of three such steps, each 1 ms on the host and its GPU work placed so that every gap is known."""

from __future__ import annotations

import pytest

from perfd.analytics.breakdown.budget import Phase
from perfd.analytics.breakdown.optimizer_seen import OptimizerImpl, OptimizerSeen, impl_of, step_class
from perfd.analytics.breakdown.step_parts import Part
from perfd.capture.analysis import TraceData, analyze_trace
from perfd.capture.ops import HostRange, Launch, RangeKind, attribute
from perfd.capture.step_marks import closure_ends
from perfd.capture.timeline_events import KernelEvent

US = 1_000.0  # ns
STEP = 1_000 * US
MAIN, AUTOGRAD = 1, 2
UNIT = "autograd::engine::evaluate_function: "
STEPS = 3
# (thread, op start and end µs, op, (its launch, its kernel's start and end µs, the kernel)) in each step
WORK = (
    (MAIN, 50, 60, "aten::linear", (55, 56, 80, "sm90_xmma_gemm_f32f32")),
    (MAIN, 100, 110, "aten::relu", (105, 106, 120, "vectorized_elementwise_kernel relu")),
    (AUTOGRAD, 210, 220, "aten::mm", (215, 216, 260, "sm90_xmma_gemm_f32f32")),
    (MAIN, 400, 420, "aten::_foreach_norm", (410, 411, 415, "multi_tensor_apply_kernel LpNormFunctor")),
    (MAIN, 600, 620, "aten::_foreach_add_", (610, 611, 640, "multi_tensor_apply_kernel AlphaFunctor")),
)


def _trace(closure: bool) -> TraceData:
    """Three steps. ``closure``: the step annotation spans the whole step (0-700 µs: forward, zeroing,
    backward on the autograd thread, the clipping's norm, the update), as ``opt.step(closure)`` records
    it; else it spans the update alone (600-700 µs), as ``loss.backward(); opt.step()`` does."""
    data = TraceData(steps=STEPS)
    corr = 0
    for k in range(STEPS):
        b = k * STEP

        def rng(tid: int, t0: float, t1: float, name: str, kind: RangeKind = RangeKind.OP,
                seq: int | None = None, at: float = b) -> None:
            data.ranges.append(HostRange(tid, at + t0 * US, at + t1 * US, name, kind, seq))

        mark = (0, 700) if closure else (600, 700)
        rng(MAIN, *mark, "Optimizer.step#SGD.step", RangeKind.ANNOTATION)
        rng(MAIN, 150, 160, "Optimizer.zero_grad#SGD.zero_grad", RangeKind.ANNOTATION)
        rng(AUTOGRAD, 200, 300, UNIT + "MmBackward0")
        rng(AUTOGRAD, 201, 299, "MmBackward0", seq=k)
        rng(AUTOGRAD, 310, 330, UNIT + "torch::autograd::AccumulateGrad")
        for tid, t0, t1, op, (at, k0, k1, kernel) in WORK:
            corr += 1
            rng(tid, t0, t1, op, seq=k if op == "aten::linear" else None)
            data.launches.append(Launch(corr, tid, b + at * US, "cudaLaunchKernel"))
            data.kernels.append(KernelEvent(0, b + k0 * US, b + k1 * US, kernel, 7, corr=corr))
    return data


def test_a_closure_steps_optimizer_phase_begins_where_its_backward_ends() -> None:
    data = _trace(closure=True)
    ops = attribute(data.ranges, data.launches, data.flows, True, data.syncs)
    assert ops is not None
    # each step's phase: from the closure's last backward work (AccumulateGrad, 330 µs) to the mark's end
    tails = [(a / US, b / US) for a, b in ops.tails]
    assert tails == [(k * 1000 + 330, k * 1000 + 700) for k in range(STEPS)]
    parts = [ops.parts.get(c) for c in range(1, len(WORK) + 1)]
    # the forward inside the annotation is the layers' (it was all "optimizer"); the update and the
    # clipping's norm are the optimizer's
    assert parts == [Part.LINEAR, Part.ACTIVATION, Part.LINEAR, Part.OPTIMIZER, Part.OPTIMIZER]
    assert ops.optimizer == OptimizerSeen("SGD", OptimizerImpl.FOREACH)


def test_the_closures_forward_and_backward_are_the_forward_backward_phase() -> None:
    """Per complete step (µs): the optimizer phase is the gap before the norm (260 → 411: 151), the norm
    (4), the gap before the update (415 → 611: 196) and the update (29); forward-backward is the rest of
    the 1000: the GEMMs (24 + 44), the activation (14), the gaps before them (26, 96) and the one between
    the steps (640 → 1056: 416), which the next step's closure ends."""
    d = analyze_trace(_trace(closure=True)).devices[0]
    assert d.complete is not None and d.complete.steps == 2
    per = {ph: {p: ms * 1000 / 2 for p, ms in parts.items()} for ph, parts in d.complete.phase_ms.items()}
    opt, layers = per[Phase.OPTIMIZER.value], per[Phase.LAYERS.value]
    assert opt == pytest.approx({Part.OPTIMIZER.value: 33.0, Part.IDLE_SHORT.value: 347.0})
    assert layers == pytest.approx({Part.LINEAR.value: 68.0, Part.ACTIVATION.value: 14.0,
                                    Part.IDLE_SHORT.value: 416.0 + 26.0 + 96.0})
    assert d.optimizer == OptimizerSeen("SGD", OptimizerImpl.FOREACH)


def test_a_step_without_a_closure_keeps_its_phase() -> None:
    """The same work with the annotation around the update alone: the forward is the layers' either way,
    and the optimizer phase still runs from the backward's end to the next step's first forward launch."""
    data = _trace(closure=False)
    ops = attribute(data.ranges, data.launches, data.flows, True, data.syncs)
    assert ops is not None
    assert [ops.parts.get(c) for c in range(1, 4)] == [Part.LINEAR, Part.ACTIVATION, Part.LINEAR]
    # (the first: the window's head before its first forward launch)
    assert [(a / US, b / US) for a, b in ops.tails][1:3] == [(330, 1055), (1330, 2055)]


def test_the_closures_backward_ends_at_its_last_backward_range() -> None:
    assert closure_ends([(0, 100), (200, 300)], [(10, 20), (30, 60), (250, 400)]) == [60, 400]
    assert closure_ends([(0, 100)], [(150, 160)]) == [None]  # no backward inside: no closure


@pytest.mark.parametrize(("op", "impl"), [
    ("aten::_foreach_add_", OptimizerImpl.FOREACH), ("aten::_fused_adamw_", OptimizerImpl.FUSED),
    ("aten::addcdiv_", OptimizerImpl.PER_PARAMETER), ("_single_tensor_adam", OptimizerImpl.PER_PARAMETER),
    ("_multi_tensor_sgd", OptimizerImpl.FOREACH)])
def test_the_implementation_is_what_the_update_ran(op: str, impl: OptimizerImpl) -> None:
    assert impl_of(op) is impl


def test_the_class_is_the_step_annotations() -> None:
    assert step_class("Optimizer.step#SGD.step") == "SGD"
    assert step_class("Optimizer.step#AdamW.step") == "AdamW"
    assert step_class("ProfilerStep#3") is None

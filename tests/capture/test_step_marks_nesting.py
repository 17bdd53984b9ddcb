"""torch.optim's step marks one a step, where a container steps optimizers inside its own step."""

from __future__ import annotations

from perfd.capture.ops import HostRange, RangeKind
from perfd.capture.step_marks import innermost, optimizer_marks, outermost

A = RangeKind.ANNOTATION


def _steps(n: int, nested: bool) -> list[HostRange]:
    out = []
    for k in range(n):
        t = 1000.0 * k
        out.append(HostRange(7, t + 900, t + 990, "Optimizer.step#OptimizersContainer.step" if nested
                             else "Optimizer.step#AdamW.step", A))
        if nested:
            out.append(HostRange(7, t + 901, t + 980, "Optimizer.step#AdamW.step", A))
        out.append(HostRange(7, t + 0, t + 800, "aten::mm"))
    return out


def test_a_container_around_its_optimizer_counts_one_mark_a_step_and_names_the_inner_optimizer() -> None:
    ranges = _steps(3, nested=True)
    outer = optimizer_marks(ranges)
    assert [r.name for r in outer] == ["Optimizer.step#OptimizersContainer.step"] * 3
    inner = optimizer_marks(ranges, innermost)
    assert [r.name for r in inner] == ["Optimizer.step#AdamW.step"] * 3


def test_plain_marks_are_each_a_step_and_other_threads_do_not_nest() -> None:
    assert len(optimizer_marks(_steps(4, nested=False))) == 4
    # the same span on two threads: neither holds the other
    assert outermost([(1, 0.0, 10.0), (2, 0.0, 10.0)]) == [True, True]
    assert innermost([(1, 0.0, 10.0), (1, 2.0, 5.0), (1, 3.0, 4.0)]) == [False, False, True]
    spans = [(1, 0.0, 10.0), (1, 2.0, 5.0), (1, 3.0, 4.0), (1, 11.0, 12.0)]
    assert outermost(spans) == [True, False, False, True]

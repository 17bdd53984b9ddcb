"""What torch.optim's step annotations (``Optimizer.step#SGD.step``) say beyond where each step is: which
of them wrap a closure, and the work each one launched last. perfd.capture.ops reads the optimizer phase
and the job's optimizer (perfd.analytics.breakdown.optimizer_seen) from them. Pure: spans on host
threads in (ns), positions out.

``optimizer.step(closure)`` (Lightning's automatic optimisation, LBFGS, a plain loop that passes one)
runs the closure inside the annotation: the step's forward, its zeroing, its backward and the gradient
clipping, then the optimizer's own update. Such a mark holds backward work (the autograd engine's ranges,
on its own thread); only what follows the closure's last backward work is the optimizer's.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeVar

from perfd.analytics.breakdown.op_parts import is_step_mark

Span = tuple[float, float]  # host ns: start, end


def closure_ends(marks: Sequence[Span], backward: Iterable[Span]) -> list[float | None]:
    """Per step mark, where the backward of the closure it wraps ends (the latest end of a backward range
    that starts inside it, on any thread); None: the mark holds no backward work (no closure)."""
    back = sorted(backward)
    starts = [b[0] for b in back]
    out: list[float | None] = []
    for start, end in marks:
        lo, hi = bisect.bisect_left(starts, start), bisect.bisect_right(starts, end)
        out.append(max(b[1] for b in back[lo:hi]) if hi > lo else None)
    return out


def _by_thread(spans: Iterable[tuple[int, float, float, int]]) -> dict[int, list[tuple[float, float, int]]]:
    out: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
    for tid, start, end, k in spans:
        out[tid].append((start, end, k))
    for w in out.values():
        w.sort()
    return out


def _inside(w: list[tuple[float, float, int]], ns: float) -> int:
    """The key of the span of ``w`` (sorted, disjoint) that holds ``ns``; -1: none."""
    j = bisect.bisect_right(w, (ns, float("inf"), 0)) - 1
    return w[j][2] if j >= 0 and ns <= w[j][1] else -1


def starts_inside(points: Sequence[tuple[int, float]],
                  spans: Iterable[tuple[int, float, float]]) -> list[bool]:
    """Each (thread, ns) point: whether a span of its own thread holds it."""
    by = _by_thread((tid, a, b, 0) for tid, a, b in spans)
    return [tid in by and _inside(by[tid], ns) >= 0 for tid, ns in points]


def last_inside(points: Iterable[tuple[int, float, int]],
                spans: Sequence[tuple[int, float, float]]) -> dict[int, int]:
    """Per span (its index), the key of the latest (thread, ns, key) point of its thread it holds."""
    by = _by_thread((tid, a, b, k) for k, (tid, a, b) in enumerate(spans))
    last: dict[int, tuple[float, int]] = {}
    for tid, ns, key in points:
        w = by.get(tid)
        k = _inside(w, ns) if w else -1
        if k >= 0 and (k not in last or ns >= last[k][0]):
            last[k] = (ns, key)
    return {k: key for k, (_ns, key) in last.items()}


# A step mark inside another on the same thread is an optimizer that a container steps: torchtitan's
# OptimizersContainer is a torch.optim Optimizer whose step steps each model part's AdamW, so each training
# step holds ``Optimizer.step#OptimizersContainer.step`` with ``Optimizer.step#AdamW.step`` inside it (one
# H200 trace of torchtitan 0.2.2's qwen3: counted as two, the 648 ms step read as two of 324 ms). The
# outermost marks count the steps; the innermost name the optimizer that updates the weights.
def _nesting(spans: Sequence[tuple[int, float, float]]) -> tuple[list[bool], list[bool]]:
    """Per span: (held by another of its thread, holds another of its thread)."""
    held, holds = [False] * len(spans), [False] * len(spans)
    by: dict[int, list[int]] = defaultdict(list)
    for i, (tid, _a, _b) in enumerate(spans):
        by[tid].append(i)
    for idx in by.values():
        idx.sort(key=lambda i: (spans[i][1], -spans[i][2]))
        reach, reach_i = float("-inf"), -1
        for i in idx:
            _tid, start, end = spans[i]
            if reach_i >= 0 and start >= spans[reach_i][1] and end <= reach:
                held[i] = True
            if end > reach:
                reach, reach_i = end, i
        for i, j in itertools.pairwise(idx):  # marks nest or are disjoint: the next one starting inside
            if spans[j][1] < spans[i][2] and spans[j][2] <= spans[i][2]:
                holds[i] = True
    return held, holds


def outermost(spans: Sequence[tuple[int, float, float]]) -> list[bool]:
    """Per (thread, start, end) span: whether no other span of its thread holds it (one a step)."""
    return [not h for h in _nesting(spans)[0]]


def innermost(spans: Sequence[tuple[int, float, float]]) -> list[bool]:
    """Per span: whether it holds no other span of its thread (the optimizer that runs the update)."""
    return [not h for h in _nesting(spans)[1]]


class _Range(Protocol):
    @property
    def tid(self) -> int: ...
    @property
    def start_ns(self) -> float: ...
    @property
    def end_ns(self) -> float: ...
    @property
    def name(self) -> str: ...


R = TypeVar("R", bound=_Range)


def optimizer_marks(ranges: Iterable[R], which: Callable[[Sequence[tuple[int, float, float]]], list[bool]]
                    = outermost) -> list[R]:
    """torch.optim's step marks among ``ranges``: the outermost (one a training step) by default, or
    ``innermost`` (the optimizers that update the weights), in the order given."""
    marks = [r for r in ranges if is_step_mark(r.name)]
    keep = which([(r.tid, r.start_ns, r.end_ns) for r in marks])
    return [r for r, k in zip(marks, keep, strict=True) if k]

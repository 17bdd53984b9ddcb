"""A trace written by a job's process cannot stall the analysis of a capture by how deeply its host
ranges nest (perfd.capture.ops). The review's input: N ``cpu_op`` ranges each inside the one before,
N ``cudaLaunchKernel`` calls inside the innermost and their N kernels, N ``ProfilerStep#`` marks;
`perfd analyze trace` took 1.7 s at N=2000, 20.3 s at N=8000 and over a minute at N=30000 (op
attribution walked every launch's ancestors), under the agent's one-trace-at-a-time lock
(perfd.capture.bookkeeping) that stalls every job's captures. Backward units nested the same way,
each linked by autograd's flow to the next one in, took the analysis past Python's recursion limit;
past perfd.core.limits.MAX_TRACE_AUTOGRAD_LINKS links they are refused (trace_nesting).

The work is measured, not timed: the lines perfd.capture.ops executes (a trace function counting
them, in that module's frames only) at N and 4N grow as N does, not as N²; and the review's N=30000
traces are analysed whole, to the answer the nesting implies.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from perfd.capture import ops
from perfd.capture.analysis import TraceData
from perfd.capture.chrome_trace import analyze_chrome_trace, read_chrome_trace
from perfd.capture.ops import OpAttribution, attribute
from perfd.capture.trace_input import TraceRefused
from perfd.core import limits as L

UNIT = "autograd::engine::evaluate_function: "
# Nested op names that reach every rule: batched matmuls and softmaxes around each other (the core
# attention search walks their wrappers), a matmul wrapper, an op no rule places.
NAMES = ("aten::matmul", "aten::bmm", "aten::softmax", "aten::add")


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args: object) -> dict[str, object]:
    ev: dict[str, object] = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": tid}
    if args:
        ev["args"] = args
    return ev


def nested(n: int, cat: str = "cpu_op") -> list[dict[str, object]]:
    """The review's trace: ``n`` ranges of ``cat``, each inside the one before, ``n`` launches (and a
    synchronising call) inside the innermost, their kernels, ``n`` step marks."""
    name: Callable[[int], str] = ((lambda i: NAMES[i % len(NAMES)]) if cat == "cpu_op"
                                  else (lambda i: f"nn.Module: Block_{i}" if i % 2 else f"model.py(1): f{i}"))
    ev = [_x(cat, name(i), i, 10 * n - 2 * i) for i in range(n)]
    for i in range(n):
        ev.append(_x("cuda_runtime", "cudaLaunchKernel", n + 2 * i, 1, correlation=i))
        ev.append(_x("kernel", f"k{i}", n + 2 * i, 1, tid=7, correlation=i, device=0, stream=7))
        ev.append(_x("user_annotation", f"ProfilerStep#{i}", i, 1))
    ev.append(_x("cuda_runtime", "cudaDeviceSynchronize", 3 * n + 1, 1))
    return ev


def units(n: int, chained: bool = True) -> list[dict[str, object]]:
    """``n`` backward units each inside the one before. Chained: each linked by a ``fwdbwd`` flow to
    the next one in (the flow ends in unit k before unit k+1 opens, starts in unit k+1 before k+2
    opens), the innermost to a forward ``aten::mm``, a launch in each unit: the outermost's part is
    found through ``n`` links, and two more units linked to each other (a cycle no autograd graph has).
    Not chained: each unit linked to a forward op of its own, ``n`` launches in the innermost."""
    ev = [_x("cpu_op", f"{UNIT}MulBackward0", 10 * k, 20 * n - 20 * k) for k in range(n)]
    t = 20 * n + 10

    def flow(k: int, fwd: tuple[int, float], bwd: tuple[int, float]) -> None:
        ev.append({"ph": "s", "cat": "fwdbwd", "id": k, "ts": fwd[1], "pid": 0, "tid": fwd[0]})
        ev.append({"ph": "f", "cat": "fwdbwd", "id": k, "ts": bwd[1], "pid": 0, "tid": bwd[0], "bp": "e"})

    def launch(c: int, tid: int, ts: float) -> None:
        ev.append(_x("cuda_runtime", "cudaLaunchKernel", ts, 0.5, tid=tid, correlation=c))
        ev.append(_x("kernel", f"k{c}", ts, 1, tid=7, correlation=c, device=0, stream=7))

    for k in range(n):
        if chained:
            nxt = (1, 10 * (k + 1) + 2) if k + 1 < n else (4, t + 30 + 2 * k + 0.5)
            flow(k, nxt, (1, 10 * k + 2))
            launch(k, 1, 10 * k + 3)
        else:
            flow(k, (4, t + 30 + 2 * k + 0.5), (1, 10 * k + 2))
            launch(k, 1, 10 * n + k / 2)
        ev.append(_x("cpu_op", "aten::mm", t + 30 + 2 * k, 1, tid=4))  # a forward op
    if chained:
        ev += [_x("cpu_op", f"{UNIT}CloneBackward0", t, 10, tid=tid) for tid in (2, 3)]
        flow(n, (2, t + 1), (3, t + 2))
        flow(n + 1, (3, t + 1), (2, t + 2))
        launch(n, 2, t + 5)
        launch(n + 1, 3, t + 5)
    ev += [_x("user_annotation", "ProfilerStep#1", 0, 1), _x("user_annotation", "ProfilerStep#2", t + 20, 1)]
    return ev


def load(tmp_path: Path, events: list[dict[str, object]], name: str = "t.json.gz") -> Path:
    path = tmp_path / name
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(json.dumps({"traceEvents": events}).encode())
    return path


def run(data: TraceData) -> OpAttribution | None:
    return attribute(data.ranges, data.launches, data.flows, True, data.syncs)


def lines_run(data: TraceData) -> int:
    """The lines of perfd.capture.ops that attributing ``data`` executes."""
    count = 0
    src = ops.__file__

    def line(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        count += event == "line"
        return line

    def call(frame: FrameType, event: str, arg: Any) -> Any:
        return line if frame.f_code.co_filename == src else None

    old = sys.gettrace()
    sys.settrace(call)
    try:
        run(data)
    finally:
        sys.settrace(old)
    return count


@pytest.mark.parametrize("shape", ["cpu_op", "python_function", "units"])
def test_attribution_work_grows_with_the_trace_not_with_its_nesting_squared(tmp_path: Path,
                                                                             shape: str) -> None:
    def build(n: int) -> list[dict[str, object]]:
        return units(n, chained=False) if shape == "units" else nested(n, shape)

    n = 200
    small = lines_run(read_chrome_trace(load(tmp_path, build(n), "small.json.gz")))
    large = lines_run(read_chrome_trace(load(tmp_path, build(4 * n), "large.json.gz")))
    # linear work is 4× (plus what does not grow); walking each launch's ancestors was 16×
    assert small > 1000 and large < 5 * small, (small, large)


@pytest.mark.parametrize("cat", ["cpu_op", "python_function"])
def test_the_reviews_30000_deep_trace_is_analysed_to_its_answer(tmp_path: Path, cat: str) -> None:
    n = 30_000
    path = load(tmp_path, nested(n, cat))
    data = read_chrome_trace(path)
    assert len(data.ranges) == 2 * n and len(data.launches) == n
    got = run(data)
    assert got is not None
    if cat == "cpu_op":  # the innermost op issued every kernel; the sync's owner is the outermost op
        assert set(got.op_names.values()) == {NAMES[(n - 1) % len(NAMES)]} and len(got.op_names) == n
        assert got.sync_owner == {0: NAMES[0]}
    else:  # no ops: every kernel is the innermost module frame's, whose part no rule knows
        assert set(got.op_names.values()) == {""} and len(got.labels) == n
        assert got.sync_owner == {0: f"model.py(1): f{n - 2}"}
    analysis = analyze_chrome_trace(path)  # what `perfd analyze trace` runs, whole
    assert analysis.devices and analysis.devices[0].kernel_count == n


def test_backward_units_linked_each_to_the_next_are_followed_to_a_bound_then_refused(tmp_path: Path) -> None:
    """The links are followed on a stack of the attribution's own: 30,000 of them took the analysis
    past Python's recursion limit. Each link adds " (backward)" to the label (n links nested n deep:
    n² of text), so past perfd.core.limits.MAX_TRACE_AUTOGRAD_LINKS the trace is refused, with its reason."""
    n = L.MAX_TRACE_AUTOGRAD_LINKS
    got = run(read_chrome_trace(load(tmp_path, units(n))))
    assert got is not None
    for k in (0, n - 1):  # unit k's launch: the forward op's, through n - k links
        assert got.labels[k] == "aten::mm" + " (backward)" * (n - k), k
    assert got.backward == set(range(n + 2))
    assert got.labels[n] == got.labels[n + 1] == "CloneBackward0"  # the cycle: decided, not through it
    for deep in (n + 1, 30_000):
        with pytest.raises(TraceRefused) as exc:
            run(read_chrome_trace(load(tmp_path, units(deep))))
        assert exc.value.reason == L.TRACE_REFUSED_NESTING in L.TRACE_REFUSED_REASONS
    with pytest.raises(TraceRefused, match=r"refused \(trace_nesting\)"):
        analyze_chrome_trace(load(tmp_path, units(30_000)))  # what `perfd analyze trace` runs

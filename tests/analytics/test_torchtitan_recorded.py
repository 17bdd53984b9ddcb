"""torchtitan as published, recorded on one H200 (tests/data/loops/torchtitan_h200: qwen3 0.6B from its own
train config, eager, selective activation checkpointing, fused AdamW stepped by its OptimizersContainer):
what perfd reads from the trace and what it says to do, in torchtitan's own config keys.

The recomputed forward is held to a reading of the raw Chrome trace made apart from perfd's attribution
(:func:`_recomputed_by_hand`): a kernel whose launch (runtime or driver call) sits under the autograd
engine's ``evaluate_function`` range, inside an op that is neither that node nor another backward node
and that carries an autograd sequence number, in the trace's first complete step (between its first two
``Optimizer.step#OptimizersContainer.step`` marks; the last step's final kernels are not in the trace).
"""

from __future__ import annotations

import bisect
import json
import lzma
from collections import defaultdict
from pathlib import Path

import pytest

from perfd.analytics.advice.remedies import Advice, Effort, FitContext, Framework, JobConfig, RemedyId
from perfd.analytics.advice.remedy_catalog import fit
from perfd.analytics.advice.remedy_said import Said, Say
from perfd.analytics.breakdown.budget import StepBudget, TimerShares
from perfd.analytics.breakdown.capture_budget import from_capture
from perfd.analytics.breakdown.device_breakdown import DeviceBreakdown
from perfd.analytics.breakdown.replay_table import Change
from perfd.report.remedy_text import detail_text, text
from tests.trace_cache import analyze_chrome_trace

FOLDER = Path(__file__).resolve().parents[1] / "data" / "loops" / "torchtitan_h200"
CONTAINER = "Optimizer.step#OptimizersContainer.step"
UNIT = "autograd::engine::evaluate_function: "


@pytest.fixture(scope="module")
def device() -> DeviceBreakdown:
    return analyze_chrome_trace(FOLDER / "trace.json.xz").devices[0]


@pytest.fixture(scope="module")
def budget(device: DeviceBreakdown) -> StepBudget:
    clock = json.loads((FOLDER / "meta.json").read_text())["own_clock_median_ms"]
    b = from_capture(device, device.trace_steps, timers=TimerShares(step_ms=clock))
    assert b is not None
    return b


def _recomputed_by_hand() -> tuple[int, float]:
    """(kernels, their ms) of the forward run again in the first complete step, from the raw trace."""
    with lzma.open(FOLDER / "trace.json.xz", "rt") as f:
        events = json.load(f)["traceEvents"]
    ops: dict[int, list[tuple[float, float, str, object]]] = defaultdict(list)
    launch: dict[int, tuple[int, float]] = {}
    marks: list[float] = []
    for e in events:
        cat, args = e.get("cat"), e.get("args") or {}
        if cat == "cpu_op":
            ops[e["tid"]].append((e["ts"], e["ts"] + e["dur"], e["name"], args.get("Sequence number")))
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            launch[args["correlation"]] = (e["tid"], e["ts"])
        elif cat == "user_annotation" and e["name"].startswith(CONTAINER):
            marks.append(e["ts"])
    marks.sort()
    kernels = {k["args"]["correlation"]: k["dur"] for k in events
               if k.get("cat") == "kernel" and "correlation" in (k.get("args") or {})}
    wanted: dict[int, list[tuple[float, int]]] = defaultdict(list)  # thread -> (launch time, correlation)
    for corr, (tid, ts) in launch.items():
        if corr in kernels and bisect.bisect_right(marks, ts) == 1:  # in the first complete step
            wanted[tid].append((ts, corr))
    n, us = 0, 0.0
    for tid, points in wanted.items():
        # one sweep a thread: the ops open at each launch (a stack of the ops that began before it)
        spans, j = sorted(ops[tid], key=lambda o: (o[0], -o[1])), 0
        stack: list[tuple[float, float, str, object]] = []
        for ts, corr in sorted(points):
            while j < len(spans) and spans[j][0] <= ts:
                while stack and stack[-1][1] < spans[j][0]:
                    stack.pop()
                stack.append(spans[j])
                j += 1
            chain = [(name, seq) for a, b, name, seq in stack if a <= ts <= b]
            units = [i for i, (name, _s) in enumerate(chain) if name.startswith(UNIT)]
            if not units:
                continue
            node = chain[units[-1]][0][len(UNIT):]
            inner = [seq for name, seq in chain[units[-1] + 1:]
                     if name != node and not name.endswith(("Backward0", "Backward1"))]
            if any(seq is not None for seq in inner):
                n += 1
                us += kernels[corr]
    return n, us / 1e3


def test_the_container_around_adamw_counts_one_step_a_mark(device: DeviceBreakdown) -> None:
    assert device.trace_steps == 3  # 3 containers around 3 AdamW steps: 3 steps, not 6
    facts = device.facts
    assert facts is not None
    assert facts.optimizer_class == "AdamW"  # the optimizer that updates the weights, not its container
    assert facts.optimizer is not None and facts.optimizer.value == "fused"
    assert facts.checkpointing is True and facts.compiled is False


def test_the_recomputed_forward_is_what_the_raw_trace_shows(device: DeviceBreakdown) -> None:
    r = device.recompute
    assert r is not None
    n, ms = _recomputed_by_hand()  # 1,372 kernels, 60.0 ms
    assert r.launches == pytest.approx(n, rel=0.01)
    assert r.ms == pytest.approx(ms, rel=0.01)
    # what it computes: the norms, the rotary and other pointwise ops, every second GEMM, the SiLU
    parts = dict(r.by_part)
    assert {"norm", "linear", "activation"} <= parts.keys() and "attention" not in parts  # SDPA is saved
    # a forward launch under the checkpoint costs the host more than the backward's own (116 vs 36 µs)
    assert r.forward_us is not None and r.backward_us is not None and r.forward_us > 2 * r.backward_us


def _fitted(b: StepBudget) -> dict[RemedyId, Advice]:
    return {a.remedy: a for a in fit(FitContext(b, JobConfig(framework=Framework.TORCHTITAN)))}


def test_the_remedies_are_torchtitans_config_keys_and_none_is_already_done(budget: StepBudget) -> None:
    got = _fitted(budget)
    # it already runs fused AdamW and cuDNN attention: neither is offered
    assert RemedyId.FUSED_OPTIMIZER not in got and RemedyId.FUSED_ATTENTION not in got
    flags = {r: [f.text() for f in a.flags] for r, a in got.items()}
    assert flags[RemedyId.FUSED_LAYERS] == ["--compile.enable"]
    assert flags[RemedyId.RECOMPUTE] == ["--activation_checkpoint.mode none"]
    assert flags[RemedyId.DATA_LOADER][0] == "--training.dataloader.num_workers N"
    for r in (RemedyId.FUSED_LAYERS, RemedyId.RECOMPUTE, RemedyId.DATA_LOADER):
        assert got[r].effort is Effort.FLAG
    for a in got.values():
        words = text(a.action) + detail_text(a, budget.step_ms, None)
        assert "Megatron" not in words and "main_grad" not in words, words


def test_checkpointing_off_is_read_from_the_replay_with_the_forward_host(budget: StepBudget) -> None:
    a = _fitted(budget)[RemedyId.RECOMPUTE]
    assert a.replay is Change.RECOMPUTE and a.gain is not None
    # the recomputed kernels (60 ms on the GPU) inside the range; its high end adds the host's: the
    # recomputed launches' dispatch and the forward's launches at the backward's own cost a launch
    assert a.gain.low_ms < 60.0 < a.gain.high_ms
    assert _says(a.gain.basis, Say.CHECKPOINT_FORWARD)
    assert a.cost is not None and "memory" in text(a.cost)


def _says(s: Said, code: Say) -> bool:
    return s.code is code or any(isinstance(x, Said) and _says(x, code) for x in s.args)

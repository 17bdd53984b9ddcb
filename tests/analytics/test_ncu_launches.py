"""ncu rows by launch, on real data.

- The layers perfd finds by repetition agree with the ``nn.Module: TransformerLayer_N`` frames of the
  H100 Megatron-LM trace recorded with Python stacks (tests/capture/op_reference.py reads them, apart
  from perfd's code), forward and backward, launch by launch.
- A range of ncu's launches (the same launches, in the same order, with the same filter: what ncu
  numbers 0, 1, ... from the range's start plus its --launch-skip) is matched to the timeline's
  launches, and each launch gets the op that made it: the nvjet 256x128 kernel is linear's for the QKV,
  projection and MLP GEMMs and attention's for Q·Kᵀ. No trace of the same run as the recorded ncu range
  (tests/data/ncu/h100_megatron_rank0_*.csv) exists; tests/gpu records one pair (see the report).
- What a range covers is said, and the window ncu-prefix chooses covers the forward and backward of the
  stage's last layer.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from perfd.analytics.breakdown.ncu_rows import MatchHow, Phase
from perfd.analytics.ncu.join import kernel_filter, timeline_kernels
from perfd.analytics.ncu.launches import (
    LaunchTimeline,
    NcuLaunch,
    align,
    coverage,
    filter_regex,
    hook_start,
    layer_window,
    passes,
)
from perfd.capture.launch_order import timeline_launches
from perfd.capture.ncu_report import parse_exports
from perfd.report.ncu_text import coverage_text
from tests.trace_cache import analyze_chrome_trace, read_chrome_trace

# Its tests share what the module computes once: one xdist worker runs them (conftest.py)
pytestmark = pytest.mark.xdist_group("ncu_launches")

ROOT = Path(__file__).resolve().parents[2]
K = ROOT / "tests" / "data" / "captures" / "kineto_h100_megatron"
NCU = ROOT / "tests" / "data" / "ncu"
TNT = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"


@cache
def _timeline(trace: str) -> LaunchTimeline:
    return timeline_launches(read_chrome_trace(K / trace))


@cache
def _filter(trace: str) -> str:
    dev = analyze_chrome_trace(K / trace, top_n=200).devices[0]
    got = kernel_filter(timeline_kernels(dev), 10)  # what ncu-prefix --kernels-from writes
    assert got is not None
    return got


def _range(tl: LaunchTimeline, flt: str, step: int, skip: int, count: int) -> list[NcuLaunch]:
    """The launches a range opened at the step hook's start of ``step`` profiles: the step's launches
    that pass the filter, after ``skip``, ``count`` of them, numbered as ncu numbers them."""
    launches = [ln for ln in tl.launches if ln.step == step]
    launches = launches[hook_start(launches, tl.steps):]
    rx = filter_regex(flt)
    passing = [ln for ln in launches if passes(ln.name, rx)]
    return [NcuLaunch(i, ln.name, ln.grid, ln.block) for i, ln in enumerate(passing[skip:skip + count])]


@pytest.mark.slow
def test_layers_by_repetition_agree_with_the_module_frames():
    from tests.capture.op_reference import Reference, _load

    path = K / "ops_stack_rank0.json.gz"
    ref = Reference(_load(str(path)))
    layer_re = re.compile(r"^nn\.Module: TransformerLayer_(\d+)$")

    def layer_of(op: dict[str, Any]) -> int | None:
        for o in [*ref.enclosing.get(id(op), []), op]:
            m = layer_re.match(o["name"])
            if m:
                return int(m.group(1)) + 1
        return None

    def ref_layer(g: dict[str, Any]) -> int | None:
        op = ref.ops.get(g.get("args", {}).get("External id"))
        if op is None:
            return None
        if ref._backward_node(op) is None:
            return layer_of(op)
        seqs = [o.get("args", {}).get("Sequence number") for o in [*ref.enclosing.get(id(op), []), op]]
        fwd = next((ref.forward_by_seq[s] for s in seqs if s in ref.forward_by_seq), None)
        return layer_of(fwd) if fwd is not None else None

    want = {g["args"]["correlation"]: ref_layer(g) for g in ref.gpu
            if g.get("cat") == "kernel" and "correlation" in g.get("args", {})}
    data = read_chrome_trace(path)
    tl = timeline_launches(data)
    kernels = sorted((k for k in data.kernels if k.corr is not None), key=lambda k: k.corr or 0)
    agree: collections.Counter[tuple[str, str]] = collections.Counter()
    for k, ln in zip(kernels, tl.launches, strict=True):
        r = want.get(k.corr)
        if r is not None and ln.layer is not None:
            agree[(ln.phase.value, "same" if ln.layer == r else "different")] += 1
    assert tl.layers_total == 12
    assert agree[("forward", "different")] == 0 and agree[("backward", "different")] == 0
    # 12 layers, 4 micro-batches, 3 steps: every launch the frames place in a layer, placed the same
    assert agree[("forward", "same")] >= 1800 and agree[("backward", "same")] >= 4000


@pytest.mark.slow
def test_without_python_stacks_each_layer_repeats_forward_and_backward():
    tl = _timeline("ops_default_rank0.json.gz")
    per = collections.Counter((ln.phase, ln.layer) for ln in tl.launches
                              if ln.step == 1 and ln.microbatch == 1 and ln.layer is not None)
    assert tl.layers_total == 12
    assert {per[(Phase.FORWARD, n)] for n in range(1, 13)} == {17}
    assert {per[(Phase.BACKWARD, n)] for n in range(1, 13)} == {37}


@pytest.mark.slow
def test_a_range_from_the_step_start_is_the_forward_of_the_first_layers_only():
    """As on the H100: the range's first 40 filtered launches, no --launch-skip."""
    tl, flt = _timeline("ops_default_rank0.json.gz"), _filter("ops_default_rank0.json.gz")
    ncu = _range(tl, flt, 2, 0, 40)
    m = align(ncu, tl, flt, 0)
    assert m.how is MatchHow.EXACT and m.anchored and len(m.assigned) == 40
    cov = coverage(m, 40)
    assert not cov.both_passes and cov.phases.get("backward") is None
    assert cov.layers["forward"] == (1, 2, 3, 4) and cov.layers_total == 12 and cov.microbatches == (1,)
    assert coverage_text(cov).startswith("the 40 launches profiled were the forward pass of layers 1-4 of "
                                         "12 only (micro-batch 1; no backward launch)")
    # one kernel by name, two ops: the QKV, projection and MLP GEMMs are linear's, Q·Kᵀ attention's
    tnt = collections.Counter(m.assigned[x.id].part for x in ncu if x.name.startswith(TNT))
    assert tnt == {"linear": 6, "attention": 4}
    qk = [m.assigned[x.id] for x in ncu if x.name.startswith(TNT) and m.assigned[x.id].part == "attention"]
    assert {a.op for a in qk} == {"aten::baddbmm"}


@pytest.mark.slow
def test_the_chosen_window_covers_the_last_layers_forward_and_backward():
    tl, flt = _timeline("ops_default_rank0.json.gz"), _filter("ops_default_rank0.json.gz")
    w = layer_window(tl, flt)
    assert w is not None and w.layer == 12 and w.layers_total == 12
    ncu = _range(tl, flt, 2, w.skip, w.count)
    m = align(ncu, tl, flt, w.skip)
    cov = coverage(m, len(ncu))
    assert m.how is MatchHow.EXACT and cov.both_passes and cov.matched == len(ncu)
    # layer 12 both ways, and the launches of slack either side (the trace marks the optimizer's steps)
    assert 12 in cov.layers["forward"] and 12 in cov.layers["backward"]
    assert set(cov.layers["forward"]) <= {11, 12} and set(cov.layers["backward"]) <= {11, 12}
    assert {"attention", "linear", "norm", "activation"} <= set(cov.parts)
    assert w.count * 0.61 < 90  # profiled within the default time budget


@pytest.mark.slow
def test_another_jobs_range_is_not_matched():
    """The recorded H100 range (4 layers, h=1024) against the 12-layer h=2048 job's timeline: nothing
    agrees, so nothing is attributed; the rows keep their name join and the coverage says why."""
    rep = parse_exports([(NCU / "h100_megatron_rank0_details.csv").read_text(),
                         (NCU / "h100_megatron_rank0_raw.csv").read_text()])
    tl = _timeline("ops_default_rank0.json.gz")
    m = align(rep.order(), tl, _filter("ops_default_rank0.json.gz"), 0)
    assert m.how is MatchHow.NONE and not m.assigned
    assert "could not be matched" in coverage_text(coverage(m, rep.launches))
    # without grids (a report exported without them) the names alone do not line up either
    bare = [dataclasses.replace(x, grid=None, block=None) for x in rep.order()]
    assert align(bare, tl, None, 0).how is MatchHow.NONE


def test_the_recorded_report_keeps_every_launch_in_order_with_its_occupancy_limit():
    rep = parse_exports([(NCU / "h100_megatron_rank0_details.csv").read_text(),
                         (NCU / "h100_megatron_rank0_raw.csv").read_text()])
    order = rep.order()
    assert [x.id for x in order] == list(range(40))
    assert order[6].name == TNT and order[6].grid == (2, 66, 1) and order[6].block == (384, 1, 1)
    softmax = next(k for k in rep.kernels if "softmax_warp_forward" in k.name)
    # Block Limit Registers 10 < Block Limit Warps 16: registers cap it at 62.5%
    assert softmax.occupancy_limiter == "registers" and softmax.theoretical_occupancy == pytest.approx(0.625)
    fill = next(k for k in rep.kernels if "FillFunctor<float>" in k.name and k.grid == "(82194, 1, 1)")
    assert fill.occupancy_limiter is None  # the SM's own warp slots cap it
    # regrouped by a key per launch: the ten launches of the TNT kernel on grid (2, 66, 1), one kernel
    # by name, grid and block, split by the key
    groups = rep.regroup(lambda i: "qk" if i in (7, 18, 29) else "other")
    tnt = [(key, k.invocations) for key, k in groups if k.name == TNT and k.grid == "(2, 66, 1)"]
    assert sorted(tnt) == [("other", 7), ("qk", 3)]

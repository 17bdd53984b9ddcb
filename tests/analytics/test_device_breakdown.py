"""A captured device's breakdown read from its JSON (perfd.analytics.breakdown.device_breakdown): what
the aggregator makes of a capture's event and the state store of a kept capture is what the offline
path hands on as it is, so the same trace gives the same budget, class and match live and offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfd.aggregator.capture_records import CaptureResult
from perfd.analytics.advice.capture_findings import diagnose_capture
from perfd.analytics.breakdown.capture_budget import from_capture
from perfd.analytics.breakdown.device_breakdown import DeviceBreakdown, devices_of
from perfd.analytics.breakdown.ncu_kernels import MatchKind
from perfd.capture.bookkeeping import device_summary
from perfd.core.model import CaptureFailure
from tests.trace_cache import analyze_chrome_trace

KINETO = Path(__file__).resolve().parents[1] / "data" / "captures" / "kineto_h100_megatron"


@pytest.mark.parametrize("trace", ["tiny_rank0.json.gz", "ops_default_rank0.json.gz"])
def test_a_device_read_back_from_its_json_is_the_device(trace: str) -> None:
    """Every field, the replay table and the complete steps included, through the file format."""
    for dev in analyze_chrome_trace(KINETO / trace).devices:
        back = DeviceBreakdown.from_json(json.loads(json.dumps(dev.to_json())))
        assert back == dev


def test_the_event_summary_gives_the_budget_and_class_the_analysis_gives() -> None:
    """The agent's event leaves out the kernel and NVTX tables and rounds to 4 decimals: the budget the
    aggregator builds from it is the offline one to that rounding, and the class the same."""
    a = analyze_chrome_trace(KINETO / "ops_default_rank0.json.gz")
    live = devices_of(json.loads(json.dumps(device_summary(a))))
    assert [d.device for d in live] == [d.device for d in a.devices] and all(not d.top_kernels for d in live)
    for got, want in zip(live, a.devices, strict=True):
        b_live, b_off = from_capture(got, 3), from_capture(want, 3)
        assert b_live is not None and b_off is not None
        assert [p.part for p in b_live.parts] == [p.part for p in b_off.parts]
        assert [p.ms for p in b_live.parts] == pytest.approx([p.ms for p in b_off.parts], abs=1e-3)
    cls = diagnose_capture(live, iterations=3).bottleneck
    assert cls == diagnose_capture(a.devices, iterations=3).bottleneck


def test_a_device_without_its_index_or_with_garbage_reads_as_what_it_holds() -> None:
    assert DeviceBreakdown.from_json({"span_ms": 3.0}) is None
    d = DeviceBreakdown.from_json({"device": 1, "span_ms": "x", "trace_steps": True,
                                   "norm_rows": {"a": 1, "8": 2}, "softmax_ms": float("nan"),
                                   "idle": [{"cause": "nope", "phase": "x", "ms": 1}]})
    assert d is not None and d.span_ms == 0.0 and d.trace_steps is None and d.norm_rows == {8: 2}
    assert d.softmax_ms is None and d.idle == ()  # absent (an older breakdown), not zero
    only = DeviceBreakdown.from_json({"device": 0})
    assert devices_of([{"device": 0}, "x", {"device": "0"}, None]) == (only,)


def test_a_capture_result_is_read_once_typed_and_kept_as_it_came() -> None:
    payload = {"ranks": {"0": {"devices": [{"device": 0, "span_ms": 5.0}],
                               "ncu_categories": [{"category": "gemm"}],
                               "ncu_kernels": [{"name": "k"}, 3], "ncu_joined_to": "c1"},
                         "1": {"error": "x"}},
               "range_held_s": 2.5, "ncu_armed_at": {"0": 10.0, "x": 1.0, "1": True}, "artifact_bytes": 7,
               "cause": "not_ready"}
    r = CaptureResult.of(payload)
    assert r.raw == payload and r.range_held_s == 2.5 and r.armed_at == {0: 10.0} and r.artifact_bytes == 7
    assert r.cause is CaptureFailure.NOT_READY
    assert [d.span_ms for d in r.devices("0")] == [5.0] and r.devices("1") == () and r.devices("2") == ()
    assert r.ranks["1"].devices is None  # no list of devices: not an empty one
    (k,) = r.ranks["0"].ncu_kernels  # the row that is not an object left out
    assert k.kernel.name == "k" and k.kernel.invocations == 0 and k.match is MatchKind.NONE
    assert r.ranks["0"].ncu_joined_to == "c1"
    assert [c.category for c in r.ranks["0"].ncu_categories] == ["gemm"]
    bad = CaptureResult.of({"ranks": [1], "range_held_s": -1.0, "artifact_bytes": True})
    assert bad.ranks == {} and bad.range_held_s is None and bad.artifact_bytes is None and bad.cause is None

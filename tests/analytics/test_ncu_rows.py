"""Nsight Compute rows read from a capture's event (perfd.analytics.breakdown.ncu_rows): what the agent
wrote comes back as the same typed values and is written back the same, key for key and number for
number (the aggregator's budget JSON carried the agent's dicts as they came before they were typed);
what is not a row is left out, never a crash."""

from __future__ import annotations

import json
from pathlib import Path

from perfd.analytics.breakdown.ncu_kernels import KernelBound, MatchKind, NcuKernel
from perfd.analytics.breakdown.ncu_rows import (
    CategorySummary,
    Coverage,
    JoinedKernel,
    KernelChoiceNote,
    MatchHow,
    NcuCategory,
    categories_of,
)
from perfd.analytics.ncu.join import join, summarize
from perfd.capture.ncu_report import NcuReport, parse_exports

NCU_DATA = Path(__file__).resolve().parents[1] / "data" / "ncu"


def _report() -> NcuReport:
    return parse_exports([(NCU_DATA / f"h100_megatron_rank0_{part}.csv").read_text()
                          for part in ("details", "raw")])


def _wire(v: dict[str, object]) -> dict[str, object]:
    """Through JSON, as the event crosses the wire."""
    out = json.loads(json.dumps(v))
    assert isinstance(out, dict)
    return out


def test_the_h100_rows_come_back_as_they_were_written() -> None:
    joined = join(_report().kernels)
    assert len(joined) == 12 and any(j.kernel.stalls for j in joined)
    for j in joined:
        sent = _wire(j.to_json())
        back = JoinedKernel.from_json(sent)
        assert back == j and back.to_json() == sent
        assert list(back.to_json()) == list(sent)  # the keys in the order they were written
    for c in summarize(joined):
        sent = _wire(c.to_json())
        back_c = CategorySummary.from_json(sent)
        assert back_c == c and json.dumps(back_c.to_json()) == json.dumps(sent)


def test_a_summary_on_a_part_keeps_its_capture_choice_and_coverage() -> None:
    (first, *_) = summarize(join(_report().kernels))
    cov = Coverage(40, 38, MatchHow.PARTIAL, {"forward": 20, "backward": 18}, {"forward": (1, 2)}, 24,
                   {"linear": 30}, (0,), 812.5)
    choice = KernelChoiceNote("timeline", "c1", "by time: the top kernels of capture c1's timeline", 120, 3,
                              24)
    row = NcuCategory(first, "n1", choice, cov)
    sent = _wire(row.to_json())
    assert list(sent)[-3:] == ["kernel_choice", "coverage", "capture"]  # after the summary's own keys
    assert NcuCategory.from_json(sent) == row and categories_of([sent, 3, {"kernels": 1}]) == (row,)
    bare = NcuCategory(first, "n1")
    assert "kernel_choice" not in bare.to_json() and "coverage" not in bare.to_json()
    assert NcuCategory.from_json(_wire(bare.to_json())) == bare


def test_what_is_not_a_row_is_left_out_and_absent_figures_stay_absent() -> None:
    assert JoinedKernel.from_json({"grid": "(1, 1, 1)"}) is None  # no name
    assert CategorySummary.from_json({"kernels": 3}) is None  # no category
    k = JoinedKernel.from_json({"name": "k", "match": "sideways", "compute_throughput": "high",
                                "stalls": [{"reason": "barrier", "cycles": 2.5, "share": 0.3}, "x",
                                           {"cycles": 1}],
                                "bound": "fast", "invocations": True, "layers": [1, "2"]})
    assert k is not None and k.match is MatchKind.NONE and k.kernel.compute_throughput is None
    assert [s.reason for s in k.kernel.stalls] == ["barrier"] and k.kernel.bound is None
    assert k.kernel.invocations == 0 and k.layers == (1,)
    c = CategorySummary.from_json({"category": "gemm", "bound": "memory-bound", "bound_ms": {"x": "1"}})
    assert c is not None and c.bound is KernelBound.MEMORY and c.bound_ms == {}
    assert c.compute_throughput is None
    assert KernelChoiceNote.from_json({"how": "first"}) is None
    assert Coverage.from_json({"launches": 1}) is None
    assert NcuKernel.from_json({"name": "k", "duration_ms": 0})

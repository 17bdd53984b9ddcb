"""Bottleneck class: timer shares first, GPM second, unknown with the reason (a code and its figures,
worded by perfd.report.bottleneck_text)."""

from __future__ import annotations

from perfd.analytics.breakdown.bottleneck import (
    BOTTLENECK_CLASSES,
    GpmReading,
    GpmSaid,
    GpmWhy,
    ShareSaid,
    SharesWhy,
    classify,
    classify_gpm,
)
from perfd.report.bottleneck_text import class_reason

# docs/design.md §2's GPM table, H200, 0.5 s windows (percent → ratio)
MATMUL = GpmReading(sm_util=0.963, sm_occupancy=0.142, tensor_util=0.935, dram_bw_util=0.176, nvml_util=1.0)
COPY = GpmReading(sm_util=0.988, sm_occupancy=0.799, tensor_util=0.0, dram_bw_util=0.878, nvml_util=1.0)
TINY = GpmReading(sm_util=0.0004, sm_occupancy=0.0, tensor_util=0.0, dram_bw_util=0.0, nvml_util=0.34)
IDLE = GpmReading(sm_util=0.0, sm_occupancy=0.0, tensor_util=0.0, dram_bw_util=0.0, nvml_util=0.0)


def _gpm(g: GpmReading) -> str:
    return classify_gpm(g.sm_util, g.sm_occupancy, g.tensor_util, g.dram_bw_util, g.nvml_util).cls


def test_gpm_table_rows() -> None:
    assert _gpm(MATMUL) == "compute-bound"
    assert _gpm(COPY) == "memory-bound"
    assert _gpm(TINY) == "launch-overhead"
    assert _gpm(IDLE) == "unknown"
    none = classify_gpm()
    assert none.cls == "unknown" and none.reason == GpmWhy(GpmSaid.NO_COUNTERS, GpmReading())
    assert class_reason(none) == "no GPM counters (GPU without GPM support or not sampled)"
    tiny = classify_gpm(TINY.sm_util, TINY.sm_occupancy, TINY.tensor_util, TINY.dram_bw_util, TINY.nvml_util)
    assert isinstance(tiny.reason, GpmWhy) and tiny.reason.said is GpmSaid.TINY_KERNELS
    assert class_reason(tiny).endswith("(GPM): many tiny kernels")


def test_timer_shares() -> None:
    assert classify(0.25, 0.1, 0.05, 1, None, 0.0).cls == "data-bound"
    assert classify(0.03, 0.4, 0.35, 1, None, 0.0).cls == "communication-bound"
    # the fixture: exposed comm 25% is p2p wait, stage idle 24% → pipeline-bound
    assert classify(0.039, 0.25, 0.003, 2, 0.24, 1 / 17).cls == "pipeline-bound"
    assert classify(0.03, 0.1, 0.02, 4, 0.05, 3 / 7).cls == "pipeline-bound"  # analytic bubble 43%
    assert classify(0.03, 0.35, 0.02, 2, 0.1, 0.05).cls == "communication-bound"
    data = classify(0.25, 0.1, 0.05, 1, None, 0.0, data_timer="data-wait")
    assert data.reason == SharesWhy(ShareSaid.DATA, 0.25, "data-wait")
    assert class_reason(data) == "data-wait takes 25.0% of the step (> 20%)"


def test_gpm_only_when_timers_do_not_decide() -> None:
    assert classify(0.03, 0.1, 0.02, 1, None, 0.0, MATMUL).cls == "compute-bound"
    assert classify(0.25, 0.1, 0.02, 1, None, 0.0, MATMUL).cls == "data-bound"
    res = classify(0.03, 0.1, 0.02, 1, None, 0.0)
    assert res.cls == "unknown" and isinstance(res.reason, SharesWhy) and res.reason.said is ShareSaid.NONE
    assert res.reason.gpm is None and ("data_share", 0.03) in res.reason.checked
    said = class_reason(res)
    assert said.endswith("; no GPM counters") and "data_share 3.0%" in said
    assert classify(None, None, None, None, None, None).cls == "unknown"
    assert set(BOTTLENECK_CLASSES) >= {"compute-bound", "memory-bound", "launch-overhead",
                                       "communication-bound", "sync-bound", "data-bound", "pipeline-bound",
                                       "unknown"}

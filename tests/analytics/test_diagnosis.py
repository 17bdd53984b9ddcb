"""The bottleneck ladder (perfd.analytics.diagnosis), with the GPM figures measured in DESIGN.md §3
(the co-tenant DP=2 job: tensor 13%, SM 46%, DRAM 23%) and the recorded capture's class."""

from __future__ import annotations

from perfd.analytics.bottleneck import GpmReading
from perfd.analytics.diagnosis import TimelineClass, classify_job

DP2_GPM = GpmReading(sm_util=0.46, tensor_util=0.13, dram_bw_util=0.23, nvml_util=1.0)


def test_the_dp2_job_is_no_longer_unknown_kernel_efficiency() -> None:
    b = classify_job(0.010, 0.017, 0.017, 1, None, None, mfu=0.24, gpm=DP2_GPM)
    assert b.cls == "compute-bound"
    assert "kernel efficiency" in b.reason and "tensor-core use 13%" in b.reason
    assert b.evidence["compute_share"] == 1 - 0.010 - 0.017
    assert b.sources["tensor_util"].startswith("collectors/nvml")


def test_timers_first_then_the_capture_then_gpm() -> None:
    assert classify_job(0.3, 0.01, 0.01, 1, None, None).cls == "data-bound"
    tl = TimelineClass("memory-bound", "elementwise/normalisation 51% of kernel time",
                       "capture c1 (kineto, [1])")
    b = classify_job(0.01, 0.02, 0.02, 1, None, None, mfu=0.24, gpm=DP2_GPM, timeline=tl)
    assert b.cls == "memory-bound" and "capture c1" in b.reason and "GPM" in b.reason
    assert b.sources["timeline"] == "capture c1 (kineto, [1])" and "tensor_util" in b.evidence
    matmul = GpmReading(sm_util=0.963, tensor_util=0.935, dram_bw_util=0.176, nvml_util=1.0)
    assert classify_job(None, None, None, None, None, None, gpm=matmul).cls == "compute-bound"


def test_unknown_names_what_is_missing() -> None:
    b = classify_job(None, None, None, None, None, None)
    assert b.cls == "unknown" and "GPM counters" in b.reason and "a capture of the job" in b.reason

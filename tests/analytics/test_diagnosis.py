"""The bottleneck class from its votes (perfd.analytics.breakdown.diagnosis), with the GPM figures measured in
docs/design.md §3 (the co-tenant DP=2 job: tensor 13%, SM 46%, DRAM 23%) and §2 (tiny kernels: NVML util
34%, SM 0.04%) and a recorded capture's class."""

from __future__ import annotations

from perfd.analytics.breakdown.bottleneck import BottleneckClass, GpmReading
from perfd.analytics.breakdown.diagnosis import StepShares, TimelineClass, classify_job

DP2_GPM = GpmReading(sm_util=0.46, tensor_util=0.13, dram_bw_util=0.23, nvml_util=1.0)
TINY_GPM = GpmReading(sm_util=0.0004, tensor_util=0.0, dram_bw_util=0.0, nvml_util=0.34)
FILLS = StepShares(0.010, 0.017, 0.017, 1, None, None, mfu=0.24)


def _votes(b):
    return {v["source"]: v["class"] for v in b.evidence_json()["votes"]}


def test_the_dp2_job_is_no_longer_unknown_kernel_efficiency() -> None:
    b = classify_job(FILLS, gpm=DP2_GPM)
    assert b.cls == "compute-bound" and b.winner == "timers"
    assert "kernel efficiency" in b.reason and "tensor-core use 13%" in b.reason
    assert b.evidence["compute_share"] == 1 - 0.010 - 0.017
    assert b.sources["tensor_util"].startswith("collectors/nvml")
    assert _votes(b) == {"timers": "compute-bound", "gpm": "unknown"}


def test_timers_first_then_the_capture_then_gpm() -> None:
    b = classify_job(StepShares(0.3, 0.01, 0.01, 1), gpm=DP2_GPM)
    assert b.cls == "data-bound" and b.winner == "timers" and "beyond its threshold" in b.why
    tl = TimelineClass(BottleneckClass.MEMORY, "elementwise/normalisation 51% of kernel time",
                       "capture c1 (kineto, [1])")
    b = classify_job(StepShares(0.01, 0.02, 0.02, 1, mfu=0.24), gpm=DP2_GPM, timeline=tl)
    assert b.cls == "memory-bound" and b.winner == "capture" and "gpm:" in b.reason
    assert b.sources["timeline"] == "capture c1 (kineto, [1])" and "tensor_util" in b.evidence
    matmul = GpmReading(sm_util=0.963, tensor_util=0.935, dram_bw_util=0.176, nvml_util=1.0)
    b = classify_job(StepShares(), gpm=matmul)
    assert b.cls == "compute-bound" and b.winner == "gpm"


def test_launch_bound_when_compute_fills_the_step_but_the_sms_idle() -> None:
    # The tiny config: timers say compute fills the step; GPM says the SMs are idle.
    b = classify_job(FILLS, gpm=TINY_GPM)
    assert b.cls == "launch-overhead" and b.winner == "gpm"
    assert _votes(b) == {"timers": "unknown", "gpm": "launch-overhead"}  # slow kernels or launches?
    # Even where NVML util is low too (a GPU idle 97% of the time): the job steps, so the host is slow.
    idle = GpmReading(sm_util=0.01, tensor_util=0.0, dram_bw_util=0.0, nvml_util=0.03)
    assert classify_job(FILLS, gpm=idle).cls == "launch-overhead"
    # Without the timers saying compute fills the step, an idle GPU decides nothing.
    assert classify_job(StepShares(), gpm=idle).cls == "unknown"


def test_the_timers_alone_do_not_call_a_low_mfu_job_compute_bound() -> None:
    """Offline, log only: compute fills the step at MFU 24%. Slow kernels and a host too slow to
    launch them look alike to the host's timers (the tiny and big H100 jobs were launch-bound by
    their captures while the log said compute 98%): unknown, saying what would tell."""
    b = classify_job(FILLS)
    assert b.cls == "unknown" and "slow kernels or slow launches" in b.reason
    assert "no GPU-side evidence" in b.reason and "a capture of the job" in b.reason
    # A GPU with a kernel resident nearly all the time: the kernels are the slow part.
    busy = GpmReading(nvml_util=0.97)
    b = classify_job(FILLS, gpm=busy)
    assert b.cls == "compute-bound" and b.winner == "timers" and "kernels resident 97%" in b.reason
    # Resident 34% of the time: still the timers cannot tell (GPM's SM reading is what decides).
    assert classify_job(FILLS, gpm=GpmReading(nvml_util=0.34)).cls == "unknown"
    # At MFU 45% the GPU demonstrably does the model's math: compute-bound from the timers alone.
    assert classify_job(StepShares(0.010, 0.017, 0.017, 1, mfu=0.45)).cls == "compute-bound"


def test_a_capture_of_tiny_kernels_decides_launch_bound_and_gpm_agreement_is_said() -> None:
    tl = TimelineClass(BottleneckClass.LAUNCH, "idle 97% with 2.1 µs median kernels",
                       "capture c9 (kineto, [0])")
    b = classify_job(FILLS, gpm=TINY_GPM, timeline=tl)
    assert b.cls == "launch-overhead" and b.winner == "capture" and "gpm agree" in b.reason
    assert classify_job(FILLS, timeline=tl).cls == "launch-overhead"


def test_the_class_is_a_function_of_the_same_data() -> None:
    # Live, after the job (the last steady window's GPM) and offline with the same inputs agree.
    tl = TimelineClass(BottleneckClass.MEMORY, "elementwise 51%", "capture c1")
    live = classify_job(FILLS, gpm=DP2_GPM, timeline=tl, gpm_when="GPM while the job stepped")
    after = classify_job(FILLS, gpm=DP2_GPM, timeline=tl, gpm_when="GPM of the last steady window")
    assert live.cls == after.cls == "memory-bound"


def test_unknown_names_what_is_missing() -> None:
    b = classify_job(StepShares())
    assert b.cls == "unknown" and "GPM counters" in b.reason and "a capture of the job" in b.reason
    assert b.winner is None

"""The bottleneck class from its votes (perfd.analytics.breakdown.diagnosis), with the GPM figures measured in
docs/design.md §3 (the co-tenant DP=2 job: tensor 13%, SM 46%, DRAM 23%) and §2 (tiny kernels: NVML util
34%, SM 0.04%) and a recorded capture's class. The votes are codes and figures; a few golden phrases check
how the report words them (perfd.report.bottleneck_text)."""

from __future__ import annotations

from perfd.analytics.breakdown.bottleneck import (
    Bottleneck,
    BottleneckClass,
    BudgetClass,
    ClassBasis,
    ClassSource,
    ComputeSaid,
    ComputeWhy,
    Decided,
    GpmReading,
    GpmVoteWhy,
    GpmWhen,
    Missing,
    Quoted,
    Voted,
)
from perfd.analytics.breakdown.diagnosis import StepShares, TimelineClass, classify_job
from perfd.report.bottleneck_text import bottleneck_json, class_reason

DP2_GPM = GpmReading(sm_util=0.46, tensor_util=0.13, dram_bw_util=0.23, nvml_util=1.0)
TINY_GPM = GpmReading(sm_util=0.0004, tensor_util=0.0, dram_bw_util=0.0, nvml_util=0.34)
FILLS = StepShares(0.010, 0.017, 0.017, 1, None, None, mfu=0.24)


def _votes(b: Bottleneck) -> dict[str, str]:
    return {v.source.value: v.cls.value for v in b.votes}


def _said(b: Bottleneck, source: ClassSource) -> object:
    return next(v.reason for v in b.votes if v.source is source)


def test_the_dp2_job_is_no_longer_unknown_kernel_efficiency() -> None:
    b = classify_job(FILLS, gpm=DP2_GPM)
    assert b.cls == "compute-bound" and b.winner == "timers" and b.decided is Decided.TIMERS
    timers, gpm = _said(b, ClassSource.TIMERS), _said(b, ClassSource.GPM)
    assert isinstance(timers, ComputeWhy) and timers.said is ComputeSaid.KERNEL_EFFICIENCY
    assert isinstance(gpm, GpmVoteWhy) and gpm.not_matrix and not gpm.host_launch
    said = class_reason(b)
    assert "kernel efficiency" in said and "tensor-core use 13%" in said
    assert b.evidence["compute_share"] == 1 - 0.010 - 0.017
    assert b.sources["tensor_util"] is ClassSource.GPM
    assert bottleneck_json(b)["bottleneck_sources"]["tensor_util"] == (
        "collectors/nvml GPM of the job's GPUs (mean), GPM while the job stepped")
    assert _votes(b) == {"timers": "compute-bound", "gpm": "unknown"}


def test_timers_first_then_the_capture_then_gpm() -> None:
    b = classify_job(StepShares(0.3, 0.01, 0.01, 1), gpm=DP2_GPM)
    assert b.cls == "data-bound" and b.winner == "timers" and b.decided is Decided.SHARE
    assert bottleneck_json(b)["bottleneck_evidence"]["why"] == (
        "a share of the step beyond its threshold decides: it is where the step's time goes")
    tl = TimelineClass(BottleneckClass.MEMORY, Quoted("elementwise/normalisation 51% of kernel time"),
                       "capture c1 (kineto, [1])")  # an older store's record: its reason in words
    b = classify_job(StepShares(0.01, 0.02, 0.02, 1, mfu=0.24), gpm=DP2_GPM, timeline=tl)
    assert b.cls == "memory-bound" and b.winner == "capture" and "gpm:" in class_reason(b)
    assert class_reason(b).startswith("elementwise/normalisation 51% of kernel time [capture]")
    assert b.sources["timeline"] is ClassSource.CAPTURE and "tensor_util" in b.evidence
    assert bottleneck_json(b)["bottleneck_sources"]["timeline"] == "capture c1 (kineto, [1])"
    matmul = GpmReading(sm_util=0.963, tensor_util=0.935, dram_bw_util=0.176, nvml_util=1.0)
    b = classify_job(StepShares(), gpm=matmul)
    assert b.cls == "compute-bound" and b.winner == "gpm"


def test_launch_bound_when_compute_fills_the_step_but_the_sms_idle() -> None:
    # The tiny config: timers say compute fills the step; GPM says the SMs are idle.
    b = classify_job(FILLS, gpm=TINY_GPM)
    assert b.cls == "launch-overhead" and b.winner == "gpm"
    assert _votes(b) == {"timers": "unknown", "gpm": "launch-overhead"}  # slow kernels or launches?
    gpm = _said(b, ClassSource.GPM)
    assert isinstance(gpm, GpmVoteWhy) and gpm.host_launch
    assert class_reason(b).startswith("SMs busy only 0% (GPM) while compute fills the step: the host cannot "
                                      "launch kernels as fast as the GPU runs them [gpm]")
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
    timers = _said(b, ClassSource.TIMERS)
    assert b.cls == "unknown" and isinstance(timers, ComputeWhy) and timers.said is ComputeSaid.CANNOT_TELL
    assert b.reason == Voted((Missing.GPM, Missing.CAPTURE))
    said = class_reason(b)
    assert "slow kernels or slow launches" in said
    assert "no GPU-side evidence" in said and "a capture of the job" in said
    # A GPU with a kernel resident nearly all the time: the kernels are the slow part.
    busy = GpmReading(nvml_util=0.97)
    b = classify_job(FILLS, gpm=busy)
    assert b.cls == "compute-bound" and b.winner == "timers" and "kernels resident 97%" in class_reason(b)
    # Resident 34% of the time: still the timers cannot tell (GPM's SM reading is what decides).
    assert classify_job(FILLS, gpm=GpmReading(nvml_util=0.34)).cls == "unknown"
    # At MFU 45% the GPU demonstrably does the model's math: compute-bound from the timers alone.
    assert classify_job(StepShares(0.010, 0.017, 0.017, 1, mfu=0.45)).cls == "compute-bound"


def test_a_capture_of_tiny_kernels_decides_launch_bound_and_gpm_agreement_is_said() -> None:
    shares = {BottleneckClass.LAUNCH: 0.62, BottleneckClass.MEMORY: 0.2, BottleneckClass.COMPUTE: 0.1}
    basis = ClassBasis(decided=BudgetClass(BottleneckClass.LAUNCH, shares, 0.42), where="capture c9 rank 0")
    tl = TimelineClass(BottleneckClass.LAUNCH, basis, "capture c9 (kineto, [0])")
    b = classify_job(FILLS, gpm=TINY_GPM, timeline=tl)
    assert b.cls == "launch-overhead" and b.winner == "capture" and b.decided is Decided.CAPTURE
    assert next(v for v in b.votes if v.source is ClassSource.CAPTURE).reason is basis  # typed, worded there
    assert class_reason(b) == ("launch 62%, memory 20%, compute 10% of the step (capture c9 rank 0) "
                               "[capture]; gpm agree")
    assert classify_job(FILLS, timeline=tl).cls == "launch-overhead"


def test_the_class_is_a_function_of_the_same_data() -> None:
    # Live, after the job (the last steady window's GPM) and offline with the same inputs agree.
    tl = TimelineClass(BottleneckClass.MEMORY, Quoted("elementwise 51%"), "capture c1")
    live = classify_job(FILLS, gpm=DP2_GPM, timeline=tl, gpm_when=GpmWhen.STEPPING)
    after = classify_job(FILLS, gpm=DP2_GPM, timeline=tl, gpm_when=GpmWhen.LAST_STEADY)
    assert live.cls == after.cls == "memory-bound"
    votes = bottleneck_json(after)["bottleneck_evidence"]["votes"]
    assert [v["detail"] for v in votes] == [
        "step timers (perfd.analytics.steps.metrics)", "capture c1",
        "GPM of the job's last steady window (the job is not stepping now)"]


def test_unknown_names_what_is_missing() -> None:
    b = classify_job(StepShares())
    assert b.cls == "unknown" and b.winner is None and b.decided is Decided.NONE
    assert b.reason == Voted((Missing.DATA_SHARE, Missing.COMM, Missing.GPM, Missing.CAPTURE))
    said = class_reason(b)
    assert "GPM counters" in said and "a capture of the job" in said

"""The job's bottleneck class from every source present, each with its vote (docs/design.md §2
"Bottleneck class").

Three sources vote, each with its class and numbers (:class:`Vote`):

- **timers** split the step into data loading, exposed communication, pipeline idle and compute
  (perfd.analytics.breakdown.bottleneck.classify). A share beyond its threshold is where the step's time
  goes, measured inside the step: it decides. Otherwise, when compute fills the step, the timers
  vote compute-bound, the least they can say (they cannot see inside the kernels) — when the MFU
  shows the GPU doing model math (≥ 40% of peak), or NVML shows a kernel resident nearly all the
  time; otherwise slow kernels and a host too slow to launch them look alike to them (unknown).
- **capture**: the latest capture's timeline (perfd.analytics.advice.capture_findings) saw every kernel of
a
  few steps: tiny kernels with idle gaps (launch-overhead), idle without them (sync-bound), pointwise
  kernels (memory-bound), GEMMs filling the GPU (compute-bound), SendRecv waits (pipeline-bound).
- **GPM** of the job's GPUs, taken only while the job steps (after it ends, its last steady window):
  tensor cores busy (compute-bound), DRAM busy with tensor idle (memory-bound), SMs idle while
  compute fills the step (launch-overhead: the host cannot feed the GPU), SMs busy without either
  (compute-bound, kernel efficiency).

The winner: a timer share beyond its threshold, else the capture (the most direct view of the
compute), else GPM, else the timers' compute-bound (as above). ``unknown`` when no source can decide,
naming what is missing. The summary carries every vote and why the winner won. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from perfd.analytics import thresholds as th
from perfd.analytics.breakdown import bottleneck as bn
from perfd.analytics.breakdown.bottleneck import (
    B,
    BottleneckClass,
    CaptureWhy,
    ClassSource,
    ComputeSaid,
    ComputeWhy,
    Decided,
    GpmVoteWhy,
    GpmWhen,
    Missing,
    Vote,
    Voted,
)
from perfd.analytics.breakdown.device_breakdown import DeviceBreakdown
from perfd.analytics.breakdown.ncu_rows import JoinedKernel, NcuCategory
from perfd.analytics.common import BATCH_GENERATOR
from perfd.analytics.steps.untimed import Untimed

COMPUTE_FILLS_STEP = th.COMPUTE_FILLS_STEP.value
LOW_MFU = th.LOW_MFU.value
GPU_ALWAYS_BUSY = th.GPU_ALWAYS_BUSY.value
GPM_TENSOR_LOW = th.GPM_TENSOR_LOW.value


@dataclass(frozen=True)
class TimelineClass:
    """The class a capture's timeline supports (perfd.analytics.advice.capture_findings), and what
    the run's analysis needs to build the step budget from it: the device's breakdown
    (perfd.analytics.breakdown.device_breakdown) and how many iterations it covered (None: inferred
    from the steady step time)."""

    cls: BottleneckClass
    # why the capture supports it: its timeline's basis or its ncu rows' (words: perfd.report), typed so
    # that the run's analysis reads it as it was made; compared, never hashed (a basis holds a mapping)
    reason: CaptureWhy = field(hash=False)
    source: str  # the capture's label, e.g. "capture c2026... (kineto, rank 1)"
    device: DeviceBreakdown | None = field(default=None, compare=False, hash=False)
    iterations: int | None = None
    capture_id: str = ""  # compared instead of the device: one capture, one breakdown
    # An Nsight Compute capture of the job: its per-category summaries, detail of the budget's parts;
    # compared by its capture id
    ncu: tuple[NcuCategory, ...] = field(default=(), compare=False, hash=False)
    ncu_id: str = ""
    # ... and its joined kernel rows (each part's top kernels), and the timeline capture they joined
    ncu_kernels: tuple[JoinedKernel, ...] = field(default=(), compare=False, hash=False)
    # Every device of the capture (the checks of perfd.analytics.breakdown.capture_match read them all:
    # one stage's SendRecv may be on another device of an nsys capture); () : ``device`` alone
    devices: tuple[DeviceBreakdown, ...] = field(default=(), compare=False, hash=False)
    forced: bool = False  # read against the job even where capture_match says it is another job's
    ncu_joined_to: str | None = None


@dataclass(frozen=True)
class StepShares:
    """What the timers say of a step (ratios in [0, 1]; None = not measured)."""

    data_share: float | None = None
    comm_exposed: float | None = None
    comm_grad_sync: float | None = None
    pp: int | None = None
    pp_idle_max: float | None = None
    pp_bubble_analytic: float | None = None
    mfu: float | None = None
    # The groups whose collectives the timers do not see (perfd.analytics.steps.untimed): the exposed
    # share is the timed ones' only, never "communication is small".
    untimed: Untimed = ()
    data_timer: str = BATCH_GENERATOR  # what the job's source calls its data wait (its vocabulary)
    cpu_only: bool = False  # the job computes on CPUs (perfd.core.model.JobInfo.device): no GPU to ask about

    def compute_share(self) -> float | None:
        """1 − data − exposed comm − pipeline idle, when the timers give each part."""
        pipe = self.pp_idle_max if self.pp and self.pp > 1 else 0.0
        if self.data_share is None or self.comm_exposed is None or pipe is None:
            return None
        return 1.0 - self.data_share - self.comm_exposed - pipe


def _timers_vote(s: StepShares, resident: float | None = None) -> tuple[Vote | None, bool, dict[str, float]]:
    """(the timers' vote, whether a share beyond its threshold decided it, the numbers)."""
    t = bn.classify(s.data_share, s.comm_exposed, s.comm_grad_sync, s.pp, s.pp_idle_max, s.pp_bubble_analytic,
                    data_timer=s.data_timer)
    nums = dict(t.evidence)
    if t.cls != B.UNKNOWN:
        assert isinstance(t.reason, bn.SharesWhy)  # classify without GPM: a share decided
        return Vote(ClassSource.TIMERS, t.cls, t.reason, nums), True, nums
    compute = s.compute_share()
    if compute is None:
        return None, False, nums
    nums["compute_share"] = compute
    pipe = s.pp_idle_max if s.pp and s.pp > 1 else None

    def why(said: ComputeSaid, mfu: float | None = None, resident: float | None = None) -> ComputeWhy:
        return ComputeWhy(said, compute, s.data_share or 0.0, s.comm_exposed or 0.0, pipe, s.untimed, mfu,
                          resident)

    if compute < COMPUTE_FILLS_STEP:  # no part dominates
        return Vote(ClassSource.TIMERS, B.UNKNOWN, why(ComputeSaid.UNDER), nums), False, nums
    if s.cpu_only:  # no kernels, no launches: the step is the CPUs' own computation
        return Vote(ClassSource.TIMERS, B.COMPUTE, why(ComputeSaid.CPU_ONLY), nums), False, nums
    if s.mfu is None or s.mfu < LOW_MFU:
        # The host's compute timers also hold the time it takes to launch the kernels: with the
        # model's math far below peak they cannot tell slow kernels from a host too slow to feed
        # the GPU (the tiny and big H100 jobs: compute 98% of the step, launch-bound by their
        # captures). Only a GPU that always has a kernel resident makes it the kernels.
        if s.mfu is not None:
            nums["mfu"] = s.mfu
        if resident is None or resident < GPU_ALWAYS_BUSY:
            return (Vote(ClassSource.TIMERS, B.UNKNOWN, why(ComputeSaid.CANNOT_TELL, s.mfu, resident), nums),
                    False, nums)
        # kernel efficiency: the kernels run far below peak (which ones, a capture's categories say)
        efficiency = why(ComputeSaid.KERNEL_EFFICIENCY, s.mfu, resident)
        return Vote(ClassSource.TIMERS, B.COMPUTE, efficiency, nums), False, nums
    return Vote(ClassSource.TIMERS, B.COMPUTE, why(ComputeSaid.FILLS), nums), False, nums


def _gpm_vote(g: bn.GpmReading, compute_fills: bool, when: GpmWhen) -> Vote:
    c = bn.classify_gpm(g.sm_util, g.sm_occupancy, g.tensor_util, g.dram_bw_util, g.nvml_util)
    assert isinstance(c.reason, bn.GpmWhy)
    nums = dict(c.evidence)
    sm = g.sm_util
    if (
        compute_fills
        and sm is not None
        and sm < bn.GPM_SM_STARVED
        and c.cls in (B.UNKNOWN, B.LAUNCH)
    ):
        # The step is spent in forward/backward on the host's timeline while the SMs sit idle: the
        # host does not launch work fast enough (tiny kernels, Python overhead).
        return Vote(ClassSource.GPM, B.LAUNCH, GpmVoteWhy(c.reason, host_launch=True), nums, when=when)
    # tensor cores little used: most kernel time is not matrix math (unfused elementwise work, small GEMMs)
    low = c.cls in (B.COMPUTE, B.UNKNOWN) and g.tensor_util is not None and g.tensor_util < GPM_TENSOR_LOW
    return Vote(ClassSource.GPM, c.cls, GpmVoteWhy(c.reason, not_matrix=low), nums, when=when)


def classify_job(
    shares: StepShares,
    gpm: bn.GpmReading | None = None,
    timeline: TimelineClass | None = None,
    gpm_when: GpmWhen = GpmWhen.STEPPING,
) -> bn.Bottleneck:
    """The job's class with every source's vote; see the module docstring for who wins. Its reason is
    the votes' (:class:`perfd.analytics.breakdown.bottleneck.Voted`), worded where shown."""
    timers, decisive, nums = _timers_vote(shares, gpm.nvml_util if gpm is not None else None)
    compute = nums.get("compute_share")
    votes: list[Vote] = [v for v in (timers,) if v is not None]
    if timeline is not None and timeline.cls != B.UNKNOWN:
        votes.append(Vote(ClassSource.CAPTURE, timeline.cls, timeline.reason, {}, timeline.source))
    if gpm is not None:
        votes.append(_gpm_vote(gpm, compute is not None and compute >= COMPUTE_FILLS_STEP, gpm_when))
    src = {k: ClassSource.TIMERS for k in nums}
    for v in votes:
        if v.source is ClassSource.GPM:
            nums.update(v.numbers)
            src.update({k: ClassSource.GPM for k in v.numbers})
    by = {v.source: v for v in votes if v.cls != B.UNKNOWN}
    # A share beyond its threshold is where the step's time goes; else the capture's timeline saw every
    # kernel (the most direct view of the compute time); else GPM shows how the GPU spends it; else the
    # timers alone: compute fills the step.
    if decisive and timers is not None:
        winner, decided = timers, Decided.SHARE
    elif ClassSource.CAPTURE in by:
        winner, decided = by[ClassSource.CAPTURE], Decided.CAPTURE
    elif ClassSource.GPM in by:
        winner, decided = by[ClassSource.GPM], Decided.GPM
    elif ClassSource.TIMERS in by:
        winner, decided = by[ClassSource.TIMERS], Decided.TIMERS
    else:
        missing = [m for m, v in ((Missing.DATA_SHARE, shares.data_share),
                                  (Missing.COMM, shares.comm_exposed)) if v is None]
        if gpm is None and not shares.cpu_only:  # a CPU-only job has no GPU to count or capture
            missing.append(Missing.GPM)
        if timeline is None and not shares.cpu_only:
            missing.append(Missing.CAPTURE)
        return bn.Bottleneck(B.UNKNOWN, Voted(tuple(missing)), nums, src, tuple(votes), None, Decided.NONE)
    if winner.source is ClassSource.CAPTURE:
        src["timeline"] = ClassSource.CAPTURE
    return bn.Bottleneck(winner.cls, Voted(), nums, src, tuple(votes), winner.source, decided)

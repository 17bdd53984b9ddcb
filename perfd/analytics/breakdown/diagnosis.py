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

from collections.abc import Mapping
from dataclasses import dataclass, field

from perfd.analytics import thresholds as th
from perfd.analytics.breakdown import bottleneck as bn
from perfd.analytics.breakdown.bottleneck import B, BottleneckClass, ClassSource, Vote
from perfd.analytics.common import BATCH_GENERATOR
from perfd.analytics.steps.untimed import Untimed, untimed_text

COMPUTE_FILLS_STEP = th.COMPUTE_FILLS_STEP.value
LOW_MFU = th.LOW_MFU.value
GPU_ALWAYS_BUSY = th.GPU_ALWAYS_BUSY.value
GPM_TENSOR_LOW = th.GPM_TENSOR_LOW.value


_TIMERS_SRC = "step timers (perfd.analytics.steps.metrics)"
_GPM_SRC = "collectors/nvml GPM of the job's GPUs (mean)"


@dataclass(frozen=True)
class TimelineClass:
    """The class a capture's timeline supports (perfd.analytics.advice.capture_findings), and what
    the run's analysis needs to build the step budget from it: the device's breakdown (perfd.capture.analysis
    JSON) and how many iterations it covered (None: inferred from the steady step time)."""

    cls: BottleneckClass
    reason: str
    source: str  # e.g. "capture c2026... (kineto, rank 1)"
    device: Mapping[str, object] | None = field(default=None, compare=False, hash=False)
    iterations: int | None = None
    capture_id: str = ""  # compared instead of the device: one capture, one breakdown
    # An Nsight Compute capture of the job: its per-category summaries (perfd.analytics.ncu.join
    # CategorySummary JSON), detail of the budget's parts; compared by its capture id
    ncu: tuple[Mapping[str, object], ...] = field(default=(), compare=False, hash=False)
    ncu_id: str = ""
    # ... and its joined kernel rows (JoinedKernel JSON): each part's top kernels
    ncu_kernels: tuple[Mapping[str, object], ...] = field(default=(), compare=False, hash=False)
    # Every device of the capture (the checks of perfd.analytics.breakdown.capture_match read them all:
    # one stage's SendRecv may be on another device of an nsys capture); () : ``device`` alone
    devices: tuple[Mapping[str, object], ...] = field(default=(), compare=False, hash=False)
    forced: bool = False  # read against the job even where capture_match says it is another job's


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
    cpu_only: bool = False  # the job computes on CPUs (perfd.model.JobInfo.device): no GPU to ask about

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
        return Vote(ClassSource.TIMERS, t.cls, t.reason, nums, _TIMERS_SRC), True, nums
    compute = s.compute_share()
    if compute is None:
        return None, False, nums
    nums["compute_share"] = compute
    pipe = f", pipeline idle {s.pp_idle_max:.1%}" if s.pp and s.pp > 1 and s.pp_idle_max is not None else ""
    untimed = f"; {untimed_text(s.untimed)}" if s.untimed else ""
    why = (
        f"compute fills {compute:.0%} of the step (data {s.data_share or 0.0:.1%}, exposed comm "
        f"{s.comm_exposed or 0.0:.1%}{' of the timed collectives' if untimed else ''}{pipe}{untimed})"
    )
    if compute < COMPUTE_FILLS_STEP:
        return (
            Vote(
                ClassSource.TIMERS,
                B.UNKNOWN,
                why + f" — under {COMPUTE_FILLS_STEP:.0%}, no part dominates",
                nums,
                _TIMERS_SRC,
            ),
            False,
            nums,
        )
    if s.cpu_only:  # no kernels, no launches: the step is the CPUs' own computation
        return Vote(ClassSource.TIMERS, B.COMPUTE, why + ": the job computes on its CPUs (no CUDA)", nums,
                    _TIMERS_SRC), False, nums
    if s.mfu is None or s.mfu < LOW_MFU:
        # The host's compute timers also hold the time it takes to launch the kernels: with the
        # model's math far below peak they cannot tell slow kernels from a host too slow to feed
        # the GPU (the tiny and big H100 jobs: compute 98% of the step, launch-bound by their
        # captures). Only a GPU that always has a kernel resident makes it the kernels.
        if s.mfu is not None:
            nums["mfu"] = s.mfu
        low = f" yet MFU is {s.mfu:.{0 if s.mfu >= 0.1 else 1}%}" if s.mfu is not None else " (MFU unknown)"
        if resident is None or resident < GPU_ALWAYS_BUSY:
            seen = (f"kernels resident only {resident:.0%} of the time (NVML)" if resident is not None
                    else "no GPU-side evidence")
            return (
                Vote(ClassSource.TIMERS, B.UNKNOWN, why + f"{low}: slow kernels or slow launches — the "
                     f"timers cannot tell which, and {seen} (a capture or GPM can)", nums, _TIMERS_SRC),
                False,
                nums,
            )
        why += (
            f"{low} with kernels resident {resident:.0%} of the time (NVML): kernel efficiency — the "
            "kernels run far below peak (the timers cannot say which kernels: a capture's kernel "
            "categories can)"
        )
    return Vote(ClassSource.TIMERS, B.COMPUTE, why, nums, _TIMERS_SRC), False, nums


def _gpm_vote(g: bn.GpmReading, compute_fills: bool, when: str) -> Vote:
    c = bn.classify_gpm(g.sm_util, g.sm_occupancy, g.tensor_util, g.dram_bw_util, g.nvml_util)
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
        return Vote(
            ClassSource.GPM,
            B.LAUNCH,
            f"SMs busy only {sm:.0%} (GPM) while compute fills the step: the host cannot launch "
            "kernels as fast as the GPU runs them",
            nums,
            when,
        )
    reason = c.reason
    if c.cls in (B.COMPUTE, B.UNKNOWN) and g.tensor_util is not None and g.tensor_util < GPM_TENSOR_LOW:
        sm_ = f" (SM {sm:.0%})" if sm is not None else ""
        reason += (
            f"; tensor-core use {g.tensor_util:.0%}{sm_}: most kernel time is not matrix math (unfused "
            "elementwise/softmax work or small GEMMs)"
        )
    return Vote(ClassSource.GPM, c.cls, reason, nums, when)


def classify_job(
    shares: StepShares,
    gpm: bn.GpmReading | None = None,
    timeline: TimelineClass | None = None,
    gpm_when: str = "GPM while the job stepped",
) -> bn.Bottleneck:
    """The job's class with every source's vote; see the module docstring for who wins."""
    timers, decisive, nums = _timers_vote(shares, gpm.nvml_util if gpm is not None else None)
    compute = nums.get("compute_share")
    votes: list[Vote] = [v for v in (timers,) if v is not None]
    if timeline is not None and timeline.cls != B.UNKNOWN:
        votes.append(Vote(ClassSource.CAPTURE, timeline.cls, timeline.reason, {}, timeline.source))
    if gpm is not None:
        votes.append(_gpm_vote(gpm, compute is not None and compute >= COMPUTE_FILLS_STEP, gpm_when))
    src = {k: _TIMERS_SRC for k in nums}
    for v in votes:
        if v.source is ClassSource.GPM:
            nums.update(v.numbers)
            src.update({k: f"{_GPM_SRC}, {v.detail}" for k in v.numbers})
    by = {v.source: v for v in votes if v.cls != B.UNKNOWN}
    if decisive and timers is not None:
        winner, why = (
            timers,
            "a share of the step beyond its threshold decides: it is where the step's time goes",
        )
    elif ClassSource.CAPTURE in by:
        winner, why = (
            by[ClassSource.CAPTURE],
            ("the capture's timeline saw every kernel: the most direct view of what the compute time is"),
        )
    elif ClassSource.GPM in by:
        winner, why = (
            by[ClassSource.GPM],
            "GPM shows how the GPU spends the compute time; no capture to say more",
        )
    elif ClassSource.TIMERS in by:
        winner, why = by[ClassSource.TIMERS], "only the timers speak: compute fills the step"
    else:
        missing = [
            name
            for name, v in (
                ("data share (a data-wait timer)", shares.data_share),
                ("exposed communication (comm timers)", shares.comm_exposed),
            )
            if v is None
        ]
        if gpm is None and not shares.cpu_only:  # a CPU-only job has no GPU to count or capture
            missing.append("GPM counters while the job steps (agent with NVML on a Hopper or newer GPU)")
        if timeline is None and not shares.cpu_only:
            missing.append("a capture of the job")
        said = "; ".join(f"{v.source.value}: {v.reason}" for v in votes)
        reason = (said + "; " if said else "") + (
            "missing: " + ", ".join(missing) if missing else "no source passes its threshold"
        )
        return bn.Bottleneck(B.UNKNOWN, reason, nums, src, tuple(votes), None, "no source can decide")
    others = [v for v in votes if v is not winner]
    agree = [v.source.value for v in others if v.cls == winner.cls]
    differ = [f"{v.source.value} says {v.cls}" for v in others if v.cls not in (winner.cls, B.UNKNOWN)]
    # The timers' "cannot tell slow kernels from slow launches" is what a capture tells: not repeated.
    differ += [f"{v.source.value}: {v.reason}" for v in others if v.cls == B.UNKNOWN
               and not (winner.source is ClassSource.CAPTURE and v.source is ClassSource.TIMERS)]
    note = (f"; {', '.join(agree)} agree" if agree else "") + (f"; {'; '.join(differ)}" if differ else "")
    if winner.source is ClassSource.CAPTURE:
        src["timeline"] = winner.detail
    return bn.Bottleneck(
        winner.cls,
        f"{winner.reason} [{winner.source.value}]{note}",
        nums,
        src,
        tuple(votes),
        winner.source.value,
        why,
    )
